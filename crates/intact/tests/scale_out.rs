//! Scale-out: `intact plan`, `send --plan` under the engines sites run
//! (MPI ranks and a Slurm job array, for real; the Kubernetes manifests by
//! their shape and by running their commands), and `report merge`.
//!
//! Each engine test sends a tree to two servers whose roots, like the
//! source, are on an ext4 the test made on a loop device, then checks
//! what it can see itself: every source file under exactly one server's
//! root with the same bytes, the merged report complete, and every file
//! at level `device`.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{intact, s, stderr, stdout, Server};
use serde_json::Value;

/// The workspace's root (examples/ and scripts/ are there).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A tree of 14 files from 0 B to 3 MiB in nested directories, an empty
/// directory and a symlink.
fn tree(src: &Path) {
    for i in 0..14usize {
        let p = src.join(format!("d{}/sub{}/f{i:02}.dat", i % 3, i % 2));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, intact_sample::bytes((i * i) << 14, i as u64)).unwrap();
    }
    fs::create_dir_all(src.join("empty")).unwrap();
    std::os::unix::fs::symlink("d0/sub0/f00.dat", src.join("link")).unwrap();
}

/// Every entry under `src` is under exactly one of `roots`, the same:
/// files byte for byte, symlinks by target, directories present; and the
/// roots hold nothing else (besides intact's own state).
fn split_equal(src: &Path, roots: &[&Path]) {
    let mut holders: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for e in walkdir::WalkDir::new(src).min_depth(1) {
        let e = e.unwrap();
        let rel = e.path().strip_prefix(src).unwrap().to_path_buf();
        let ft = e.file_type();
        let here: Vec<&Path> = roots
            .iter()
            .copied()
            .filter(|r| fs::symlink_metadata(r.join(&rel)).is_ok())
            .collect();
        if ft.is_dir() {
            assert!(!here.is_empty(), "{rel:?} is nowhere");
            continue;
        }
        assert_eq!(here.len(), 1, "{rel:?} is under {here:?}");
        let got = here[0].join(&rel);
        if ft.is_symlink() {
            assert_eq!(
                fs::read_link(&got).unwrap(),
                fs::read_link(e.path()).unwrap()
            );
        } else {
            assert_eq!(
                fs::read(&got).unwrap(),
                fs::read(e.path()).unwrap(),
                "{rel:?}"
            );
        }
        *holders.entry(here[0].to_path_buf()).or_default() += 1;
    }
    assert_eq!(
        holders.len(),
        roots.len(),
        "a server got nothing: {holders:?}"
    );
    for r in roots {
        for e in walkdir::WalkDir::new(r)
            .min_depth(1)
            .into_iter()
            .filter_entry(|e| e.file_name() != ".intact")
        {
            let rel = e.unwrap().path().strip_prefix(r).unwrap().to_path_buf();
            assert!(
                fs::symlink_metadata(src.join(&rel)).is_ok(),
                "{rel:?} is not in the source"
            );
        }
    }
}

/// Source and two server roots on one loop ext4, two servers, a plan of
/// four shards over them; None after a loud skip where no loop device
/// can be made.
struct Setup {
    // Dropped in this order: the servers before their file system.
    _servers: [Server; 2],
    dir: PathBuf,
    src: PathBuf,
    roots: [PathBuf; 2],
    plan: PathBuf,
    reports: PathBuf,
    _fs: intact_faults::LoopFs,
}

impl Setup {
    fn new(test: &str) -> Option<Setup> {
        let fs_ = common::loop_ext4(test, 256)?;
        let dir = fs_.mnt().to_path_buf();
        let src = dir.join("src");
        tree(&src);
        let roots = [dir.join("dst1"), dir.join("dst2")];
        let servers = [Server::start(&roots[0]), Server::start(&roots[1])];
        let plan = dir.join("plan.json");
        let reports = dir.join("reports");
        fs::create_dir_all(&reports).unwrap();
        let to = format!("{},{}", servers[0].addr(), servers[1].addr());
        let src_arg = format!("{}/", src.display());
        let out = intact(&[
            "plan",
            &src_arg,
            "--shards",
            "4",
            "--to",
            &to,
            "-o",
            s(&plan),
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        Some(Setup {
            _fs: fs_,
            dir,
            src,
            roots,
            _servers: servers,
            plan,
            reports,
        })
    }

    /// `report merge --json` of every report written.
    fn merged(&self) -> (Option<i32>, Value) {
        common::merged(&self.plan, &self.reports)
    }

    /// The checks every engine's run must pass (`how`: the run's command,
    /// which must have exited 0; `index_from`: where every shard must have
    /// found its index).
    fn all_arrived(&self, how: &Output, index_from: &str) {
        assert_eq!(
            how.status.code(),
            Some(0),
            "{}\n{}",
            stdout(how),
            stderr(how)
        );
        let (code, m) = self.merged();
        assert_eq!(code, Some(0), "{m:#}\n{}\n{}", stdout(how), stderr(how));
        assert_eq!(m["complete"], true);
        assert_eq!(m["shards"], 4);
        let runs = m["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 4);
        // Each shard found its index where the engine put it.
        for r in runs {
            assert_eq!(r["shard"]["index_from"], index_from, "{r}");
        }
        // Every file at level device, and no other level.
        assert_eq!(m["levels"], serde_json::json!({"device": 14}), "{m:#}");
        split_equal(&self.src, &[&self.roots[0], &self.roots[1]]);
    }
}

/// The binary's directory first on PATH, so that the examples' `intact` is this build.
fn path_with_intact() -> String {
    let bin = Path::new(env!("CARGO_BIN_EXE_intact")).parent().unwrap();
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn mpi_ranks_send_the_shards_and_the_merge_is_complete() {
    let test = "mpi_ranks_send_the_shards_and_the_merge_is_complete";
    if Command::new("mpirun").arg("--version").output().is_err() {
        intact_testkit::skip(
            test,
            "mpirun (Debian's openmpi-bin) is not installed; scripts/setup installs it",
        );
        return;
    }
    let Some(t) = Setup::new(test) else { return };
    let out = Command::new(repo().join("examples/mpi/transfer.sh"))
        .args([s(&t.plan), s(&t.reports)])
        .env("PATH", path_with_intact())
        // Four ranks on a 2-core machine; root in CI.
        .env("MPIRUN_ARGS", "--oversubscribe --allow-run-as-root")
        .current_dir(&t.dir)
        .output()
        .unwrap();
    // Each rank found its shard in Open MPI's variable.
    t.all_arrived(&out, "OMPI_COMM_WORLD_RANK");
}

#[test]
fn slurm_array_job_sends_the_shards_and_the_merge_is_complete() {
    let test = "slurm_array_job_sends_the_shards_and_the_merge_is_complete";
    if !intact_testkit::is_root() {
        intact_testkit::skip(
            test,
            "a Slurm cluster of one node needs root (munged, slurmctld, slurmd)",
        );
        return;
    }
    let Some(t) = Setup::new(test) else { return };
    // Short: the cluster's unix sockets live under it (108 bytes at most).
    let cluster = tempfile::Builder::new()
        .prefix("ic")
        .tempdir_in("/tmp")
        .unwrap();
    let cluster = cluster.path();
    let script = repo().join("scripts/slurm-cluster");
    let up = Command::new(&script)
        .arg("start")
        .arg(cluster)
        .output()
        .unwrap();
    let _down = Stop(script.clone(), cluster.to_path_buf());
    if up.status.code() != Some(0) {
        // CI must run it: fail there; elsewhere say why, loudly.
        intact_testkit::skip(
            test,
            &format!("no Slurm cluster here: {}", stderr(&up).trim()),
        );
        return;
    }
    // A job that cannot start would keep `sbatch --wait` waiting: bounded.
    let out = Command::new("timeout")
        .args(["300", "sbatch", "--wait", "--array=0-3", "--chdir"])
        .arg(&t.dir)
        .arg("--output")
        .arg(t.dir.join("slurm-%a.out"))
        .arg(repo().join("examples/slurm/transfer.sbatch"))
        .args([s(&t.plan), s(&t.reports)])
        .env("SLURM_CONF", cluster.join("etc/slurm.conf"))
        .env("PATH", path_with_intact())
        .output()
        .unwrap();
    let logs: String = (0..4)
        .map(|i| fs::read_to_string(t.dir.join(format!("slurm-{i}.out"))).unwrap_or_default())
        .collect();
    assert_eq!(out.status.code(), Some(0), "{logs}");
    t.all_arrived(&out, "SLURM_ARRAY_TASK_ID");
}

/// Stops the Slurm cluster on every path out of the test.
struct Stop(PathBuf, PathBuf);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = Command::new(&self.0).arg("stop").arg(&self.1).output();
    }
}

#[test]
fn a_failed_shard_fails_the_merge_and_its_rerun_sends_only_what_failed() {
    let test = "a_failed_shard_fails_the_merge_and_its_rerun_sends_only_what_failed";
    let Some(t) = Setup::new(test) else { return };
    let plan: Value = serde_json::from_slice(&fs::read(&t.plan).unwrap()).unwrap();
    // Shard 1's largest file becomes a directory after the plan was made.
    let victim = plan["shards"][1]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "file")
        .max_by_key(|e| e["size"].as_u64())
        .unwrap();
    let victim_src = PathBuf::from(victim["source"].as_str().unwrap());
    let kept = fs::read(&victim_src).unwrap();
    fs::remove_file(&victim_src).unwrap();
    fs::create_dir(&victim_src).unwrap();
    let report = t.reports.join("shard-{shard}.json");
    for i in 0..4 {
        let out = intact(&[
            "send",
            "--plan",
            s(&t.plan),
            "--shard",
            &i.to_string(),
            "--report",
            s(&report),
            "-q",
        ]);
        assert_eq!(
            out.status.code(),
            Some(if i == 1 { 1 } else { 0 }),
            "shard {i}: {}",
            stderr(&out)
        );
    }
    let (code, m) = t.merged();
    assert_eq!(code, Some(1), "{m:#}");
    assert_eq!(m["complete"], false);
    assert_eq!(m["failed_shards"], serde_json::json!([1]));
    let failure = &m["failures"][0];
    assert_eq!(failure["shard"], 1);
    assert!(
        failure["error"].as_str().unwrap().contains("was a file"),
        "{failure}"
    );
    // The human merge says which shard to run again, and exits 1.
    let mut args = vec!["report", "merge"];
    let names: Vec<String> = (0..4)
        .map(|i| {
            t.reports
                .join(format!("shard-{i}.json"))
                .display()
                .to_string()
        })
        .collect();
    args.extend(names.iter().map(String::as_str));
    let out = intact(&args);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("shard(s) 1 failed"),
        "{}",
        stdout(&out)
    );
    // Mended, shard 1 again: only the file that failed crosses the wire.
    fs::remove_dir(&victim_src).unwrap();
    fs::write(&victim_src, &kept).unwrap();
    let out = intact(&[
        "send",
        "--plan",
        s(&t.plan),
        "--shard",
        "1",
        "--report",
        s(&report),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rerun: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        rerun["bytes_sent"].as_u64(),
        Some(kept.len() as u64),
        "{rerun:#}"
    );
    assert!(
        rerun["files"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["unchanged"] == true)
            .count()
            >= 2
    );
    t.all_arrived(&out, "--shard");
}

#[test]
fn shards_refuse_what_cannot_be_run_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    tree(&src);
    let plan = dir.path().join("plan.json");
    let make = [
        "plan",
        s(&src),
        "--shards",
        "2",
        "--to",
        "127.0.0.1:9",
        "-o",
        s(&plan),
    ];
    let out = intact(&make);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Planned again over it: refused without --force.
    let out = intact(&make);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    let out = intact(&[
        "plan",
        s(&src),
        "--shards",
        "2",
        "--to",
        "nohost",
        "-o",
        s(&dir.path().join("p2")),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // No index from anywhere: the variables looked for are named.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_intact"));
    cmd.args(["send", "--plan", s(&plan)]);
    for v in intact_shard_vars() {
        cmd.env_remove(v);
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    for v in intact_shard_vars() {
        assert!(stderr(&out).contains(v), "{}", stderr(&out));
    }
    // An index outside the plan, --delete, and --exclude are refused.
    let out = Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(["send", "--plan", s(&plan)])
        .env("SLURM_ARRAY_TASK_ID", "2")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("shards 0 to 1"), "{}", stderr(&out));
    for extra in [&["--delete"][..], &["--exclude", "*.dat"]] {
        let mut args = vec!["send", "--plan", s(&plan), "--shard", "0"];
        args.extend_from_slice(extra);
        let out = intact(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
    }
    // The plan edited after it was made is refused.
    let text = fs::read_to_string(&plan)
        .unwrap()
        .replace("127.0.0.1:9", "127.0.0.1:8");
    fs::write(&plan, text).unwrap();
    let out = intact(&["send", "--plan", s(&plan), "--shard", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no longer match"), "{}", stderr(&out));
    // A merge of a file that is not a shard's report.
    fs::write(dir.path().join("r.json"), "{\"files\": []}").unwrap();
    let out = intact(&["report", "merge", s(&dir.path().join("r.json"))]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not a shard's report"),
        "{}",
        stderr(&out)
    );
}

fn intact_shard_vars() -> [&'static str; 5] {
    [
        "SLURM_ARRAY_TASK_ID",
        "JOB_COMPLETION_INDEX",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "PMIX_RANK",
    ]
}

/// The documents of a YAML file, as JSON values.
fn yaml(path: &Path) -> Vec<Value> {
    serde_saphyr::from_multiple(&fs::read_to_string(path).unwrap()).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

/// The value after `flag` in a command.
fn after<'a>(cmd: &'a [String], flag: &str) -> &'a str {
    let at = cmd
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("no {flag} in {cmd:?}"));
    &cmd[at + 1]
}

/// Kubernetes cannot run here: the manifests are checked by their shape
/// (the Indexed Job, its volumes, the receivers' names and ports agreeing
/// with the plan's servers), and their commands are run as shipped, with
/// only the volumes' mount points moved into a temporary directory: the
/// plan job's, then the Indexed Job's with `--dry-run --json` once per
/// index, JOB_COMPLETION_INDEX set as Kubernetes sets it.
#[test]
fn the_kubernetes_manifests_have_an_indexed_job_whose_commands_run() {
    let k8s = repo().join("examples/k8s");
    let docs = yaml(&k8s.join("indexed-job.yaml"));
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"] == k)
            .unwrap_or_else(|| panic!("no {k}"))
    };
    let (svc, sts, job) = (kind("Service"), kind("StatefulSet"), kind("Job"));
    let spec = &job["spec"];
    assert_eq!(spec["completionMode"], "Indexed");
    let shards = spec["completions"].as_u64().unwrap();
    assert_eq!(spec["parallelism"].as_u64(), Some(shards));
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Never");
    let c = &pod["containers"][0];
    let send = strings(&c["command"]);
    assert_eq!(&send[..2], ["intact", "send"]);
    assert!(
        !send.iter().any(|a| a == "--shard"),
        "the index must come from JOB_COMPLETION_INDEX"
    );
    assert!(after(&send, "--report").contains("{shard}"));
    // Every mount names a volume of its pod; the key is the Secret.
    for (pod, c) in [
        (pod, c),
        (
            &sts["spec"]["template"]["spec"],
            &sts["spec"]["template"]["spec"]["containers"][0],
        ),
    ] {
        let vols: Vec<&str> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        let claims: Vec<&str> = sts["spec"]["volumeClaimTemplates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["metadata"]["name"].as_str().unwrap())
            .collect();
        for m in c["volumeMounts"].as_array().unwrap() {
            let name = m["name"].as_str().unwrap();
            assert!(
                vols.contains(&name) || claims.contains(&name),
                "mount {name} has no volume"
            );
        }
        let key = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "key")
            .unwrap();
        assert_eq!(key["secret"]["secretName"], "intact-key");
    }
    // The receivers: named by the headless Service, on the port they listen on.
    assert_eq!(svc["spec"]["clusterIP"], "None");
    let name = svc["metadata"]["name"].as_str().unwrap();
    assert_eq!(sts["spec"]["serviceName"], name);
    // The Service selects the receivers' pods.
    let labels = &sts["spec"]["template"]["metadata"]["labels"];
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "selector {k}");
    }
    assert_eq!(sts["spec"]["selector"]["matchLabels"], *labels);
    // A replacement never runs beside the pod it replaces; usage errors fail the index.
    assert_eq!(spec["podReplacementPolicy"], "Failed");
    let rule = &spec["podFailurePolicy"]["rules"][0];
    assert_eq!(rule["action"], "FailIndex");
    assert_eq!(rule["onExitCodes"]["values"], serde_json::json!([2]));
    let port = svc["spec"]["ports"][0]["port"].as_u64().unwrap();
    let serve = strings(&sts["spec"]["template"]["spec"]["containers"][0]["command"]);
    assert_eq!(&serve[..2], ["intact", "serve"]);
    assert_eq!(after(&serve, "--listen"), format!("0.0.0.0:{port}"));
    assert!(
        serve.iter().any(|a| a == "--key-file"),
        "a receiver off loopback needs a key"
    );
    let replicas = sts["spec"]["replicas"].as_u64().unwrap();
    let receivers: Vec<String> = (0..replicas)
        .map(|i| {
            format!(
                "{}-{i}.{name}:{port}",
                sts["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();

    // The plan job: its shards and servers agree with the above; run it.
    let plan_docs = yaml(&k8s.join("plan-job.yaml"));
    let plan_pod = &plan_docs[0]["spec"]["template"]["spec"];
    let script = strings(&plan_pod["containers"][0]["command"]);
    assert_eq!(&script[..2], ["sh", "-c"]);
    let line = &script[2];
    assert!(line.contains(&format!("--shards {shards}")), "{line}");
    assert!(
        line.contains(&format!("--to {}", receivers.join(","))),
        "{line}"
    );
    for v in plan_pod["volumes"].as_array().unwrap() {
        let same = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["name"] == v["name"])
            .unwrap();
        assert_eq!(
            same["persistentVolumeClaim"], v["persistentVolumeClaim"],
            "{}",
            v["name"]
        );
    }
    let dir = tempfile::tempdir().unwrap();
    // A word of a command that names a mount point, moved under `dir`.
    let moved = |text: &str| {
        let word = |w: &str| match ["/source", "/work", "/key"]
            .iter()
            .any(|m| w == *m || w.starts_with(&format!("{m}/")))
        {
            true => format!("{}{w}", dir.path().display()),
            false => w.to_string(),
        };
        text.split(' ').map(word).collect::<Vec<_>>().join(" ")
    };
    tree(&dir.path().join("source"));
    fs::create_dir_all(dir.path().join("work")).unwrap();
    fs::create_dir_all(dir.path().join("key")).unwrap();
    let out = intact(&["keygen", s(&dir.path().join("key/key"))]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = Command::new("sh")
        .arg("-c")
        .arg(moved(line))
        .env("PATH", path_with_intact())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(dir.path().join("work/reports").is_dir());
    // Each index's pod sends its own shard; together, every file once.
    let mut sent: Vec<String> = Vec::new();
    for i in 0..shards {
        let args: Vec<String> = send[1..].iter().map(|a| moved(a)).collect();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_intact"));
        for v in intact_shard_vars() {
            cmd.env_remove(v);
        }
        let out = cmd
            .args(&args)
            .args(["--dry-run", "--json"])
            .env("JOB_COMPLETION_INDEX", i.to_string())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "index {i}: {}", stderr(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let files: Vec<String> = v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "file")
            .map(|e| e["path"].as_str().unwrap().to_string())
            .collect();
        assert!(!files.is_empty(), "index {i} sends no file");
        sent.extend(files);
    }
    sent.sort();
    let mut want: Vec<String> = walkdir::WalkDir::new(dir.path().join("source"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            e.path()
                .strip_prefix(dir.path().join("source"))
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    want.sort();
    assert_eq!(sent, want);
}

/// A shard ended by SIGTERM (a Slurm time limit, `scancel`, a pod
/// deleted) leaves a report that says so, and the merge is not complete;
/// an older, complete report of the same shard does not stand for it.
#[test]
fn a_shard_killed_mid_way_leaves_a_report_that_is_not_complete() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("big"), intact_sample::bytes(8 << 20, 1)).unwrap();
    let root = dir.path().join("root");
    let server = Server::start(&root);
    let plan = dir.path().join("plan.json");
    let out = intact(&[
        "plan",
        s(&src),
        "--shards",
        "1",
        "--to",
        &server.addr(),
        "-o",
        s(&plan),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report = dir.path().join("shard-0.json");
    // A complete report of an earlier run of the shard.
    let old = serde_json::json!({
        "shard": {"plan": serde_json::from_slice::<Value>(&fs::read(&plan).unwrap()).unwrap()["id"], "index": 0, "of": 1, "to": server.addr(), "index_from": "--shard", "host": "h", "finished": 1},
        "complete": true, "files": [], "errors": [], "failed": 0
    });
    fs::write(&report, old.to_string()).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_intact"))
        .args([
            "send",
            "--plan",
            s(&plan),
            "--shard",
            "0",
            "-q",
            "--bwlimit",
            "1M",
            "--report",
            s(&report),
        ])
        .spawn()
        .unwrap();
    // The run's own report replaces the old one at its start.
    let started = std::time::Instant::now();
    loop {
        let v: Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap_or(Value::Null);
        if v["complete"] == false {
            assert!(
                v["error"]
                    .as_str()
                    .unwrap()
                    .contains("did not reach its end"),
                "{v}"
            );
            break;
        }
        assert!(
            started.elapsed().as_secs() < 20,
            "no report of this run: {v}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(!status.success());
    let v: Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    assert_eq!(v["complete"], false, "{v:#}");
    assert_eq!(v["interrupted"], "SIGTERM", "{v:#}");
    let out = intact(&["report", "merge", "--json", s(&report)]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let m: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(m["complete"], false);
    assert_eq!(m["failed_shards"], serde_json::json!([0]));
}
