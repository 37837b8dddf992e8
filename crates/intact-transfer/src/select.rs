//! Which entries a transfer takes: `--include` / `--exclude` patterns in
//! rsync's syntax for the common cases.
//!
//! Rules are checked in the order given and the first that matches
//! decides; an entry no rule matches is taken. A pattern is matched
//! against the entry's path relative to the transfer (the path it gets
//! under the destination):
//!
//! - `*` matches any run of characters except `/`, `**` any run including
//!   `/`, `?` one character except `/`, `[abc]`, `[a-z]` and `[!a]` one
//!   character of (or not of) a set;
//! - a pattern ending in `/` matches directories only;
//! - a pattern starting with `/` is anchored at the top of the transfer;
//! - a pattern with no other `/` matches the last component (the name)
//!   anywhere; one with a `/` inside matches the path's last components.
//!
//! An excluded directory is not descended into, as with rsync, so
//! `--include '*/' --include '*.dat' --exclude '*'` takes every `.dat` file.

/// Whether a rule takes or leaves what it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleKind {
    /// `--include`: take it.
    Include,
    /// `--exclude`: leave it out.
    Exclude,
}

/// One `--include` or `--exclude` pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    kind: RuleKind,
    pattern: Vec<u8>,
    dir_only: bool,
    anchored: bool,
    whole_path: bool,
    text: String,
}

impl Rule {
    /// A rule from its pattern as typed on the command line.
    pub fn new(kind: RuleKind, pattern: &str) -> Rule {
        let text = pattern.to_string();
        let mut p = pattern.as_bytes();
        let dir_only = p.len() > 1 && p.ends_with(b"/");
        if dir_only {
            p = &p[..p.len() - 1];
        }
        let anchored = p.starts_with(b"/");
        if anchored {
            p = &p[1..];
        }
        let whole_path = anchored || p.contains(&b'/') || contains_double_star(p);
        Rule {
            kind,
            pattern: p.to_vec(),
            dir_only,
            anchored,
            whole_path,
            text,
        }
    }

    /// Include or exclude.
    pub fn kind(&self) -> RuleKind {
        self.kind
    }

    /// The pattern as it was typed.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether this rule matches the entry at `rel` (relative to the
    /// transfer, `/`-separated).
    pub fn matches(&self, rel: &[u8], is_dir: bool) -> bool {
        if self.dir_only && !is_dir {
            return false;
        }
        if self.anchored {
            return glob(&self.pattern, rel);
        }
        if !self.whole_path {
            let name = rel.rsplit(|&c| c == b'/').next().unwrap_or(rel);
            return glob(&self.pattern, name);
        }
        // The path's last components: the whole path or any suffix that
        // starts after a '/'.
        glob(&self.pattern, rel)
            || rel
                .iter()
                .enumerate()
                .filter(|(_, &c)| c == b'/')
                .any(|(i, _)| glob(&self.pattern, &rel[i + 1..]))
    }
}

fn contains_double_star(p: &[u8]) -> bool {
    p.windows(2).any(|w| w == b"**")
}

/// Ordered include/exclude rules; the first that matches decides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    rules: Vec<Rule>,
}

impl Filter {
    /// A filter of `rules`, in the order they were given.
    pub fn new(rules: Vec<Rule>) -> Filter {
        Filter { rules }
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// No rules: everything is taken.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether the entry at `rel` is taken.
    pub fn takes(&self, rel: &[u8], is_dir: bool) -> bool {
        self.rules
            .iter()
            .find(|r| r.matches(rel, is_dir))
            .is_none_or(|r| r.kind == RuleKind::Include)
    }
}

/// Shell-style matching of `text` against `pat` (see the module docs).
fn glob(pat: &[u8], text: &[u8]) -> bool {
    match pat.first() {
        None => text.is_empty(),
        Some(b'*') if pat.get(1) == Some(&b'*') => {
            let rest = &pat[2..];
            // `**/` also matches no directory at all.
            if rest.first() == Some(&b'/') && glob(&rest[1..], text) {
                return true;
            }
            (0..=text.len()).any(|i| glob(rest, &text[i..]))
        }
        Some(b'*') => {
            let rest = &pat[1..];
            for i in 0..=text.len() {
                if glob(rest, &text[i..]) {
                    return true;
                }
                if text.get(i) == Some(&b'/') {
                    break;
                }
            }
            false
        }
        Some(b'?') => text.first().is_some_and(|&c| c != b'/') && glob(&pat[1..], &text[1..]),
        Some(b'[') => match (class(&pat[1..]), text.first()) {
            (Some((hit, len)), Some(&c)) if c != b'/' => {
                hit(c) && glob(&pat[1 + len..], &text[1..])
            }
            (Some(_), _) => false,
            // An unclosed '[' is an ordinary character.
            (None, Some(b'[')) => glob(&pat[1..], &text[1..]),
            (None, _) => false,
        },
        Some(b'\\') if pat.len() > 1 => {
            text.first() == Some(&pat[1]) && glob(&pat[2..], &text[1..])
        }
        Some(&c) => text.first() == Some(&c) && glob(&pat[1..], &text[1..]),
    }
}

/// A `[...]` class after its '[': a test and the bytes it spans (with the
/// closing ']'), or None when it is not closed.
#[allow(clippy::type_complexity)]
fn class(p: &[u8]) -> Option<(Box<dyn Fn(u8) -> bool>, usize)> {
    let negate = matches!(p.first(), Some(b'!') | Some(b'^'));
    let start = usize::from(negate);
    // A ']' right after the '[' (or '[!') is a member.
    let end = p
        .iter()
        .enumerate()
        .skip(start + 1)
        .find(|(_, &c)| c == b']')
        .map(|(i, _)| i)?;
    let set = p[start..end].to_vec();
    let hit = move |c: u8| {
        let mut i = 0;
        let mut found = false;
        while i < set.len() {
            if i + 2 < set.len() && set[i + 1] == b'-' {
                found |= (set[i]..=set[i + 2]).contains(&c);
                i += 3;
            } else {
                found |= set[i] == c;
                i += 1;
            }
        }
        found != negate
    };
    Some((Box::new(hit), end + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(p: &str) -> Rule {
        Rule::new(RuleKind::Exclude, p)
    }

    #[test]
    fn globs_match_like_rsync() {
        assert!(glob(b"*.dat", b"x.dat"));
        assert!(!glob(b"*.dat", b"a/x.dat"));
        assert!(glob(b"**.dat", b"a/x.dat"));
        assert!(glob(b"a/**/x", b"a/x"));
        assert!(glob(b"a/**/x", b"a/b/c/x"));
        assert!(glob(b"f?.[a-c]", b"f1.b"));
        assert!(!glob(b"f?.[!a-c]", b"f1.b"));
        assert!(glob(b"[]]", b"]"));
        assert!(glob(b"\\*", b"*"));
        assert!(!glob(b"\\*", b"x"));
    }

    #[test]
    fn names_anchors_and_directories() {
        assert!(ex("*.tmp").matches(b"data/a/x.tmp", false));
        assert!(ex("cache/").matches(b"data/cache", true));
        assert!(!ex("cache/").matches(b"data/cache", false));
        assert!(ex("/data/a").matches(b"data/a", true));
        assert!(!ex("/a").matches(b"data/a", true));
        assert!(ex("a/x.tmp").matches(b"data/a/x.tmp", false));
        assert!(!ex("a/x.tmp").matches(b"data/ba/x.tmp", false));
    }

    #[test]
    fn the_first_rule_that_matches_decides() {
        let f = Filter::new(vec![
            Rule::new(RuleKind::Include, "*/"),
            Rule::new(RuleKind::Include, "*.dat"),
            ex("*"),
        ]);
        assert!(f.takes(b"d/sub", true));
        assert!(f.takes(b"d/sub/x.dat", false));
        assert!(!f.takes(b"d/sub/x.log", false));
        assert!(Filter::default().takes(b"anything", false));
    }
}
