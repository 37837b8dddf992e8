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
    nfa: Compiled,
}

/// A rule's compiled pattern (a function of the pattern, so it takes no
/// part in comparisons).
#[derive(Clone)]
struct Compiled(std::sync::Arc<Nfa>);

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Compiled")
    }
}

impl PartialEq for Compiled {
    fn eq(&self, _: &Compiled) -> bool {
        true
    }
}

impl Eq for Compiled {}

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
            nfa: Compiled(std::sync::Arc::new(Nfa::new(p))),
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
            return self.nfa.0.run(rel, false);
        }
        if !self.whole_path {
            let name = rel.rsplit(|&c| c == b'/').next().unwrap_or(rel);
            return self.nfa.0.run(name, false);
        }
        // The path's last components: the whole path or any suffix that
        // starts after a '/', in one pass.
        self.nfa.0.run(rel, true)
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
#[cfg(test)]
fn glob(pat: &[u8], text: &[u8]) -> bool {
    Nfa::new(pat).run(text, false)
}

/// One step of a compiled pattern.
enum Token {
    /// This byte.
    Byte(u8),
    /// `?`: one byte but '/'.
    One,
    /// `[...]`: one byte but '/' of (or not of) a set, as 256 bits.
    Class([u64; 4]),
    /// `*`: any run without '/'.
    Star,
    /// `**`: any run.
    Stars,
    /// Before the `**` of a `**/`: also go straight to after its '/'
    /// (no directory at all), the index given.
    Skip(usize),
}

/// A pattern compiled for matching by simulation (a set of positions
/// advanced one text byte at a time): time linear in the text times the
/// pattern, whatever the stars (a backtracking matcher takes exponential
/// time on `*a*a*a…*b` against a long run of `a`).
struct Nfa {
    tokens: Vec<Token>,
}

impl Nfa {
    fn new(mut p: &[u8]) -> Nfa {
        let mut tokens = Vec::new();
        while let Some(&c) = p.first() {
            match c {
                b'*' if p.get(1) == Some(&b'*') => {
                    if p.get(2) == Some(&b'/') {
                        // `**/`: Skip, then `**` and '/'.
                        tokens.push(Token::Skip(tokens.len() + 3));
                        tokens.push(Token::Stars);
                        tokens.push(Token::Byte(b'/'));
                        p = &p[3..];
                    } else {
                        tokens.push(Token::Stars);
                        p = &p[2..];
                    }
                }
                b'*' => {
                    tokens.push(Token::Star);
                    p = &p[1..];
                }
                b'?' => {
                    tokens.push(Token::One);
                    p = &p[1..];
                }
                b'[' => match class(&p[1..]) {
                    Some((hit, len)) => {
                        let mut set = [0u64; 4];
                        for b in 0..=255u8 {
                            if b != b'/' && hit(b) {
                                set[usize::from(b >> 6)] |= 1 << (b & 63);
                            }
                        }
                        tokens.push(Token::Class(set));
                        p = &p[1 + len..];
                    }
                    // An unclosed '[' is an ordinary character.
                    None => {
                        tokens.push(Token::Byte(b'['));
                        p = &p[1..];
                    }
                },
                b'\\' if p.len() > 1 => {
                    tokens.push(Token::Byte(p[1]));
                    p = &p[2..];
                }
                c => {
                    tokens.push(Token::Byte(c));
                    p = &p[1..];
                }
            }
        }
        Nfa { tokens }
    }

    /// Adds position `i` and every position reachable from it without
    /// reading a byte.
    fn enter(&self, set: &mut [bool], i: usize) {
        let mut todo = vec![i];
        while let Some(i) = todo.pop() {
            if set[i] {
                continue;
            }
            set[i] = true;
            match self.tokens.get(i) {
                Some(Token::Star | Token::Stars) => todo.push(i + 1),
                Some(Token::Skip(j)) => {
                    todo.push(i + 1);
                    todo.push(*j);
                }
                _ => {}
            }
        }
    }

    /// Whether `text` matches; with `after_slash`, also any suffix of it
    /// that starts right after a '/'.
    fn run(&self, text: &[u8], after_slash: bool) -> bool {
        let n = self.tokens.len() + 1;
        let mut now = vec![false; n];
        let mut next = vec![false; n];
        self.enter(&mut now, 0);
        for &c in text {
            next.iter_mut().for_each(|x| *x = false);
            for i in (0..self.tokens.len()).filter(|&i| now[i]) {
                let to = match &self.tokens[i] {
                    Token::Byte(b) => (*b == c).then_some(i + 1),
                    Token::One => (c != b'/').then_some(i + 1),
                    Token::Class(set) => {
                        (set[usize::from(c >> 6)] >> (c & 63) & 1 == 1).then_some(i + 1)
                    }
                    Token::Star => (c != b'/').then_some(i),
                    Token::Stars => Some(i),
                    Token::Skip(_) => None,
                };
                if let Some(j) = to {
                    self.enter(&mut next, j);
                }
            }
            if after_slash && c == b'/' {
                self.enter(&mut next, 0);
            }
            std::mem::swap(&mut now, &mut next);
        }
        now[n - 1]
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

    /// The backtracking matcher the compiled one replaced: the reference
    /// for what each pattern means (exponential on some patterns, so only
    /// for short ones).
    fn reference(pat: &[u8], text: &[u8]) -> bool {
        match pat.first() {
            None => text.is_empty(),
            Some(b'*') if pat.get(1) == Some(&b'*') => {
                let rest = &pat[2..];
                if rest.first() == Some(&b'/') && reference(&rest[1..], text) {
                    return true;
                }
                (0..=text.len()).any(|i| reference(rest, &text[i..]))
            }
            Some(b'*') => {
                let rest = &pat[1..];
                for i in 0..=text.len() {
                    if reference(rest, &text[i..]) {
                        return true;
                    }
                    if text.get(i) == Some(&b'/') {
                        break;
                    }
                }
                false
            }
            Some(b'?') => {
                text.first().is_some_and(|&c| c != b'/') && reference(&pat[1..], &text[1..])
            }
            Some(b'[') => match (class(&pat[1..]), text.first()) {
                (Some((hit, len)), Some(&c)) if c != b'/' => {
                    hit(c) && reference(&pat[1 + len..], &text[1..])
                }
                (Some(_), _) => false,
                (None, Some(b'[')) => reference(&pat[1..], &text[1..]),
                (None, _) => false,
            },
            Some(b'\\') if pat.len() > 1 => {
                text.first() == Some(&pat[1]) && reference(&pat[2..], &text[1..])
            }
            Some(&c) => text.first() == Some(&c) && reference(&pat[1..], &text[1..]),
        }
    }

    #[test]
    fn the_compiled_matcher_agrees_with_the_reference_on_200000_cases() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let pat_bytes = b"ab/*?[]!-\\";
        let text_bytes = b"ab/-]";
        let mut matched = 0;
        for _ in 0..200_000 {
            let pat: Vec<u8> = (0..rnd(9))
                .map(|_| pat_bytes[rnd(pat_bytes.len() as u64) as usize])
                .collect();
            let text: Vec<u8> = (0..rnd(9))
                .map(|_| text_bytes[rnd(text_bytes.len() as u64) as usize])
                .collect();
            let want = reference(&pat, &text);
            matched += usize::from(want);
            let any_suffix = want
                || (0..text.len())
                    .filter(|&i| text[i] == b'/')
                    .any(|i| reference(&pat, &text[i + 1..]));
            assert_eq!(Nfa::new(&pat).run(&text, true), any_suffix);
            assert_eq!(
                glob(&pat, &text),
                want,
                "{:?} against {:?}",
                String::from_utf8_lossy(&pat),
                String::from_utf8_lossy(&text)
            );
        }
        assert!(matched > 1000, "too few matches to mean much: {matched}");
    }

    #[test]
    fn a_pattern_of_many_stars_takes_linear_time() {
        // Review finding D: `*a` x 12 then `*b` against 200 bytes of `a`
        // took the backtracking matcher ~10^18 steps (a session thread
        // spinning for good); the compiled one reads 200 bytes.
        let pat = format!("{}*b", "*a".repeat(12));
        let name = "a".repeat(200);
        let t = std::time::Instant::now();
        assert!(!glob(pat.as_bytes(), name.as_bytes()));
        let rule = ex(&format!("**{pat}"));
        let path = format!("{name}/{name}/{name}");
        assert!(!rule.matches(path.as_bytes(), false));
        assert!(ex(&pat).matches(format!("x/{name}b").as_bytes(), false));
        eprintln!("{:?}", t.elapsed());
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
