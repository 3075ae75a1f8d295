//! `cargo xtask docs`: the documentation check, which `cargo xtask test`
//! also runs before its long steps.
//!
//! - [`check_links`]: every relative link of every Markdown file of the
//!   repository (tracked, or new and not ignored) resolves. `[text](path)`,
//!   `![alt](path)` and `[label]: path` must name an existing file or
//!   folder, relative to the linking file (`/path`: to the repository's
//!   root), and `path#anchor` or `#anchor` a heading of that Markdown file,
//!   by GitHub's slugs (which mdBook's ids equal for these files). Links
//!   with a scheme (`https:`, `mailto:`) are not followed; code spans and
//!   fenced code blocks hold no links. Each broken link is reported as
//!   `file:line: target: why`.
//! - [`build_guide`]: `mdbook build docs` into the target directory (not
//!   the clone). mdBook is installed into `<cache>/tools` on first use, with
//!   `cargo install`; a failed install fails the step with the command to
//!   run by hand.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Result;
use crate::env::{cache_dir, cargo, run_step, target_dir, workspace_root};

/// The mdBook release the guide is built with (it builds with the
/// workspace's Rust, whose version `rust-toolchain.toml` pins).
const MDBOOK_VERSION: &str = "0.5.4";

pub(crate) fn run(args: &[String]) -> Result {
    if let Some(arg) = args.first() {
        return Err(format!("docs takes no arguments, got `{arg}`"));
    }
    let root = workspace_root();
    check_links(&root)?;
    build_guide(&root)
}

/// Checks every relative link of every Markdown file under `root`.
pub(crate) fn check_links(root: &Path) -> Result {
    println!("==> links of the Markdown files");
    let files = markdown_files(root)?;
    let mut headings = Headings::default();
    let (mut checked, mut broken) = (0, Vec::new());
    for file in &files {
        let text = read(&root.join(file))?;
        for link in links(&text) {
            checked += 1;
            if let Err(why) = resolve(root, &root.join(file), &link.target, &mut headings) {
                broken.push(format!("{}:{}: {}: {why}", file.display(), link.line, link.target));
            }
        }
    }
    if broken.is_empty() {
        println!("<== links: {checked} relative link(s) in {} file(s), all resolve", files.len());
        Ok(())
    } else {
        Err(format!("{} broken link(s) in the Markdown files:\n  {}", broken.len(), broken.join("\n  ")))
    }
}

/// The Markdown files git knows of or would add (not the ignored ones),
/// relative to `root`.
fn markdown_files(root: &Path) -> Result<Vec<PathBuf>> {
    let output = Command::new("git")
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "*.md"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("could not run git ls-files in {}: {e}", root.display()))?;
    if !output.status.success() {
        return Err(format!("git ls-files failed in {}: {}", root.display(), String::from_utf8_lossy(&output.stderr)));
    }
    let mut files: Vec<PathBuf> =
        output.stdout.split(|b| *b == 0).filter(|p| !p.is_empty()).map(|p| PathBuf::from(bytes_to_str(p))).collect();
    files.sort();
    files.dedup();
    // A file deleted but not yet staged is still listed: it links nowhere.
    files.retain(|f| root.join(f).is_file());
    Ok(files)
}

fn bytes_to_str(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// A link found in a Markdown file.
#[derive(Debug, PartialEq, Eq)]
struct Link {
    /// 1-based.
    line: usize,
    target: String,
}

/// The relative links of a Markdown text, outside code.
fn links(text: &str) -> Vec<Link> {
    let mut found = Vec::new();
    for (index, line) in prose_lines(text) {
        let line_text = without_code_spans(line);
        let targets = reference_definition(&line_text).into_iter().chain(inline_targets(&line_text));
        for target in targets.filter(|t| !t.is_empty() && !has_scheme(t)) {
            found.push(Link { line: index + 1, target });
        }
    }
    found
}

/// The lines of `text` outside fenced code blocks, with their 0-based index.
fn prose_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut fence: Option<String> = None;
    text.lines().enumerate().filter(move |(_, line)| {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let marker: String = trimmed.chars().take_while(|c| *c == '`' || *c == '~').collect();
        let first = marker.chars().next();
        let opens = indent <= 3 && marker.len() >= 3 && marker.chars().all(|c| Some(c) == first);
        match &fence {
            Some(open) if opens && trimmed.starts_with(open.as_str()) && trimmed.trim_end() == marker => {
                fence = None;
                false
            }
            Some(_) => false,
            None if opens => {
                fence = Some(marker);
                false
            }
            None => true,
        }
    })
}

/// `line` with the content of its code spans (`` `…` ``) blanked out.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        let ticks = rest[start..].chars().take_while(|c| *c == '`').count();
        let fence = &rest[start..start + ticks];
        let after = &rest[start + ticks..];
        let Some(end) = after.find(fence) else { break };
        out.push_str(&rest[..start]);
        out.push_str(&" ".repeat(ticks * 2 + end));
        rest = &after[end + ticks..];
    }
    out.push_str(rest);
    out
}

/// The target of a reference definition, `[label]: target`.
fn reference_definition(line: &str) -> Option<String> {
    let trimmed = line.trim_start();
    if line.len() - trimmed.len() > 3 || !trimmed.starts_with('[') || trimmed.starts_with("[^") {
        return None;
    }
    let (_, after) = trimmed.split_once("]:")?;
    destination(after.trim())
}

/// The targets of the inline links and images of `line`: what follows
/// each `](`, up to its closing parenthesis.
fn inline_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let mut depth = 0usize;
        let end = after.char_indices().find_map(|(i, c)| match c {
            '(' => {
                depth += 1;
                None
            }
            ')' if depth == 0 => Some(i),
            ')' => {
                depth -= 1;
                None
            }
            _ => None,
        });
        let Some(end) = end else { break };
        targets.extend(destination(&after[..end]));
        rest = &after[end..];
    }
    targets
}

/// A link destination without its title: `<a b>` or up to the first space.
fn destination(raw: &str) -> Option<String> {
    let raw = raw.trim();
    if let Some(inner) = raw.strip_prefix('<') {
        return inner.split_once('>').map(|(d, _)| d.to_string());
    }
    raw.split_whitespace().next().map(str::to_string)
}

/// Whether `target` names a scheme (`https:`, `mailto:`): not a file here.
fn has_scheme(target: &str) -> bool {
    let Some((scheme, _)) = target.split_once(':') else { return false };
    scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// The anchors of Markdown files, read once each.
#[derive(Default)]
struct Headings(HashMap<PathBuf, Vec<String>>);

impl Headings {
    fn of(&mut self, file: &Path) -> Result<&[String]> {
        if !self.0.contains_key(file) {
            let anchors = anchors(&read(file)?);
            self.0.insert(file.to_path_buf(), anchors);
        }
        Ok(self.0.get(file).map(Vec::as_slice).unwrap_or_default())
    }
}

/// Whether `target`, linked from `file`, names an existing file and, with
/// an anchor, a heading of it.
fn resolve(root: &Path, file: &Path, target: &str, headings: &mut Headings) -> Result {
    let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
    let path = percent_decoded(path);
    let resolved = if path.is_empty() {
        file.to_path_buf()
    } else if let Some(from_root) = path.strip_prefix('/') {
        root.join(from_root)
    } else {
        file.parent().unwrap_or(root).join(&path)
    };
    if !resolved.exists() {
        return Err(format!("no such file: {}", resolved.strip_prefix(root).unwrap_or(&resolved).display()));
    }
    let is_markdown = resolved.extension().is_some_and(|e| e == "md");
    if anchor.is_empty() || !is_markdown {
        return Ok(());
    }
    if headings.of(&resolved)?.iter().any(|a| a == anchor) {
        Ok(())
    } else {
        Err(format!("no heading with the anchor #{anchor}"))
    }
}

/// `%20` and the like as the characters they stand for.
fn percent_decoded(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The anchors of a Markdown text's ATX headings (`#` to `######`), in
/// order, a repeated one with `-1`, `-2`, … as GitHub and mdBook number them.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = Vec::new();
    for (_, line) in prose_lines(text) {
        let Some(heading) = heading_text(line) else { continue };
        let base = slug(heading);
        let count = seen.entry(base.clone()).or_insert(0);
        anchors.push(if *count == 0 { base.clone() } else { format!("{base}-{count}") });
        *count += 1;
    }
    anchors
}

/// The text of an ATX heading line, without its `#` marks.
fn heading_text(line: &str) -> Option<&str> {
    let trimmed = line.trim_start();
    if line.len() - trimmed.len() > 3 {
        return None;
    }
    let level = trimmed.chars().take_while(|c| *c == '#').count();
    let rest = &trimmed[level..];
    if !(1..=6).contains(&level) || !(rest.is_empty() || rest.starts_with([' ', '\t'])) {
        return None;
    }
    let text = rest.trim();
    // A closing sequence of `#` after a space is not part of the text.
    let closed = text.trim_end_matches('#');
    Some(if closed.len() < text.len() && (closed.is_empty() || closed.ends_with([' ', '\t'])) {
        closed.trim_end()
    } else {
        text
    })
}

/// GitHub's anchor of a heading: the text as shown (a link's target left
/// out), lower-cased, spaces as `-`, every other character but letters,
/// digits, `-` and `_` dropped.
fn slug(heading: &str) -> String {
    let mut shown = String::with_capacity(heading.len());
    let mut rest = heading;
    while let Some(at) = rest.find("](") {
        shown.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        rest = after.find(')').map_or("", |end| &after[end + 1..]);
    }
    shown.push_str(rest);
    shown
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// Builds the guide (`docs/`) with mdBook into the target directory.
pub(crate) fn build_guide(root: &Path) -> Result {
    let mdbook = ensure_mdbook()?;
    let out = target_dir().join("book");
    let mut command = Command::new(mdbook);
    command.arg("build").arg(root.join("docs")).arg("--dest-dir").arg(&out);
    run_step("guide (mdbook build docs)", command)?;
    println!("guide: {}", out.join("index.html").display());
    Ok(())
}

/// The mdBook binary of [`MDBOOK_VERSION`], installed into `<cache>/tools`
/// unless it is there.
fn ensure_mdbook() -> Result<PathBuf> {
    let tools = cache_dir().join("tools");
    let binary = tools.join("bin").join("mdbook");
    let version = Command::new(&binary).arg("--version").output();
    if version.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(MDBOOK_VERSION)) {
        return Ok(binary);
    }
    println!("xtask: installing mdbook {MDBOOK_VERSION} into {} (once: a build of a few minutes)", tools.display());
    let build = tools.join("build");
    let mut install = cargo(&["install", "mdbook", "--locked", "--no-default-features", "--version", MDBOOK_VERSION]);
    install.arg("--root").arg(&tools).arg("--target-dir").arg(&build);
    run_step("install mdbook", install).map_err(|e| {
        format!(
            "{e}; the guide needs mdbook {MDBOOK_VERSION}: install it with `cargo install mdbook --locked \
             --no-default-features --version {MDBOOK_VERSION} --root {}`",
            tools.display()
        )
    })?;
    // The build is not needed once the binary is in place.
    let _ = std::fs::remove_dir_all(&build);
    Ok(binary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(text: &str) -> Vec<(usize, String)> {
        links(text).into_iter().map(|l| (l.line, l.target)).collect()
    }

    #[test]
    fn inline_links_images_and_definitions_are_found_with_their_lines() {
        let text = "# T\n\nSee [the guide](docs/a.md) and ![logo](img/l.png \"title\").\n\
                    Two [a](b.md#x) [c](<d e.md>) on a line.\n\n[ref]: ../shared/x.md\n";
        let expected = [(3, "docs/a.md"), (3, "img/l.png"), (4, "b.md#x"), (4, "d e.md"), (6, "../shared/x.md")];
        assert_eq!(targets(text), expected.map(|(l, t)| (l, t.to_string())));
    }

    #[test]
    fn urls_code_spans_and_fenced_blocks_hold_no_relative_links() {
        let text = "[web](https://docs.rs/x) [mail](mailto:a@b.c) `[code](span.md)` ``[a](`b`.md)``\n\
                    ```rust\nlet x = [a](b.md);\n```\n~~~\n[c](d.md)\n~~~\n    ```\n[after](fence.md)\n";
        assert_eq!(targets(text), [(9, "fence.md".to_string())]);
    }

    #[test]
    fn a_fence_closes_only_with_its_own_marker() {
        let text = "````md\n```\n[inside](a.md)\n```\n````\n[outside](b.md)\n";
        assert_eq!(targets(text), [(6, "b.md".to_string())]);
    }

    #[test]
    fn a_destination_with_parentheses_is_read_whole() {
        assert_eq!(inline_targets("[x](a(1).md) [y](#z)"), ["a(1).md", "#z"]);
        assert_eq!(inline_targets("an unclosed [x](a.md"), Vec::<String>::new());
    }

    #[test]
    fn schemes_are_told_from_paths() {
        assert!(has_scheme("https://example.com") && has_scheme("mailto:x@y") && has_scheme("ftp+x:z"));
        assert!(!has_scheme("docs/a.md") && !has_scheme("a.md#b:c") && !has_scheme("#x") && !has_scheme("1x:y"));
    }

    #[test]
    fn slugs_follow_githubs_rules() {
        assert_eq!(slug("The `spate` command"), "the-spate-command");
        assert_eq!(slug("Checkpoints in S3"), "checkpoints-in-s3");
        assert_eq!(slug("`spate run --app`"), "spate-run---app");
        assert_eq!(slug("The demo's files"), "the-demos-files");
        assert_eq!(slug("Watching a job (`spate demo` and `spate run`)"), "watching-a-job-spate-demo-and-spate-run");
        assert_eq!(slug("map_with_state & co."), "map_with_state--co");
        assert_eq!(slug("See [the guide](docs/a.md)!"), "see-the-guide");
    }

    #[test]
    fn headings_give_anchors_and_repeats_are_numbered() {
        let text = "# Title\n## Usage ##\n#not a heading\n    # indented code\n```\n# in a fence\n```\n\
                    ### Usage\n## C# and F#\n";
        assert_eq!(anchors(text), ["title", "usage", "usage-1", "c-and-f"]);
    }

    #[test]
    fn percent_escapes_are_decoded() {
        assert_eq!(percent_decoded("a%20b.md"), "a b.md");
        assert_eq!(percent_decoded("100%.md"), "100%.md");
    }

    #[test]
    fn links_resolve_to_files_and_headings() {
        let root = std::env::temp_dir().join(format!("xtask-docs-{}", std::process::id()));
        let docs = root.join("docs");
        std::fs::create_dir_all(&docs).expect("temp folder");
        std::fs::write(root.join("README.md"), "# Spate\n## The `spate` command\n").expect("write");
        std::fs::write(docs.join("a.md"), "# A\n").expect("write");
        let from = docs.join("a.md");
        let mut headings = Headings::default();
        let mut check = |target: &str| resolve(&root, &from, target, &mut headings);
        assert_eq!(check("../README.md#the-spate-command"), Ok(()));
        assert_eq!(check("/README.md"), Ok(()));
        assert_eq!(check("#a"), Ok(()));
        assert_eq!(check("."), Ok(()));
        assert_eq!(check("../missing.md"), Err("no such file: docs/../missing.md".to_string()));
        assert_eq!(check("../README.md#usage"), Err("no heading with the anchor #usage".to_string()));
        std::fs::remove_dir_all(&root).expect("clean up");
    }
}
