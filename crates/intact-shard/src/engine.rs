//! Which shard this process is: from `--shard`, or from the index the
//! site's engine gives each of its tasks.

use crate::ShardError;

/// The variables read, in this order: Slurm job arrays, Kubernetes
/// Indexed Jobs, Open MPI, MPICH and other PMI launchers, PMIx.
pub const ENGINE_VARS: [&str; 5] = [
    "SLURM_ARRAY_TASK_ID",
    "JOB_COMPLETION_INDEX",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
];

/// The shard index and where it came from (`--shard`, or the variable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardIndex {
    /// The index.
    pub index: u32,
    /// `--shard` or the variable's name.
    pub from: &'static str,
}

/// `given` if set, else the first of [`ENGINE_VARS`] that `var` finds.
/// A value that is not a number, or none at all, is an error that names
/// the variables looked for.
pub fn shard_index(
    given: Option<u32>,
    var: impl Fn(&str) -> Option<String>,
) -> Result<ShardIndex, ShardError> {
    if let Some(index) = given {
        return Ok(ShardIndex {
            index,
            from: "--shard",
        });
    }
    let mut found: Option<ShardIndex> = None;
    for name in ENGINE_VARS {
        let Some(v) = var(name) else { continue };
        let index = v.trim().parse::<u32>().map_err(|_| {
            ShardError::Usage(format!(
                "{name}='{v}' is not a shard index (a whole number from 0)"
            ))
        })?;
        match &found {
            // Two engines nested (MPI ranks inside a Slurm array task):
            // which one numbers the shards is not for intact to guess.
            Some(first) if first.index != index => {
                return Err(ShardError::Usage(format!(
                    "{}={} and {name}={index} disagree (an engine inside another?); give --shard I",
                    first.from, first.index
                )))
            }
            Some(_) => {}
            None => found = Some(ShardIndex { index, from: name }),
        }
    }
    if let Some(found) = found {
        return Ok(found);
    }
    Err(ShardError::Usage(format!(
        "no shard index: give --shard I, or run under an engine that sets one of {}",
        ENGINE_VARS.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn engines_give_the_index_in_order() {
        assert_eq!(
            shard_index(Some(3), env(&[("PMI_RANK", "1")]))
                .unwrap()
                .index,
            3
        );
        // Several engines that agree: the first names it.
        let i = shard_index(
            None,
            env(&[("PMIX_RANK", "2"), ("SLURM_ARRAY_TASK_ID", "2")]),
        )
        .unwrap();
        assert_eq!((i.index, i.from), (2, "SLURM_ARRAY_TASK_ID"));
        // MPI ranks inside a Slurm array task: which one? Refused.
        let e = shard_index(
            None,
            env(&[("OMPI_COMM_WORLD_RANK", "1"), ("SLURM_ARRAY_TASK_ID", "2")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("disagree") && e.contains("--shard"), "{e}");
        let i = shard_index(None, env(&[("JOB_COMPLETION_INDEX", "7")])).unwrap();
        assert_eq!((i.index, i.from), (7, "JOB_COMPLETION_INDEX"));
        let i = shard_index(None, env(&[("OMPI_COMM_WORLD_RANK", "0")])).unwrap();
        assert_eq!((i.index, i.from), (0, "OMPI_COMM_WORLD_RANK"));
    }

    #[test]
    fn no_index_names_every_variable_looked_for() {
        let e = shard_index(None, env(&[])).unwrap_err().to_string();
        for v in ENGINE_VARS {
            assert!(e.contains(v), "{e}");
        }
        let e = shard_index(None, env(&[("PMI_RANK", "x")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("PMI_RANK='x'"), "{e}");
    }
}
