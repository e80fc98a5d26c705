//! The broker's modules in layers, top to bottom: a module uses only modules of layers below its
//! own (`broker/README.md` draws them). The test reads every `crate::` path in `src/` and fails
//! on one that points up or sideways, and on a module that is in no layer.

/// Top to bottom.
const LAYERS: &[(&str, &[&str])] = &[
    ("the process", &["lib", "main", "server"]),
    ("the command line, a Kafka client", &["cli"]),
    ("connections and frames", &["net"]),
    ("one handler per Kafka API", &["handlers"]),
    (
        "the metadata node and the admin requests it answers",
        &["cluster"],
    ),
    (
        "the shard: partitions, replica fetchers, the coordinators' I/O",
        &["shard"],
    ),
    ("the transaction coordinator, I/O-free", &["txn"]),
    ("the group coordinator, I/O-free", &["group"]),
    ("the share partitions, I/O-free", &["share"]),
    ("links to the other nodes", &["peer"]),
    ("TLS, SASL and SCRAM", &["security"]),
    (
        "the wire, errors, features, metrics, quota rates",
        &["codec", "errors", "features", "metrics", "loggers", "quota"],
    ),
    ("the metadata image", &["metadata"]),
    ("topic configs", &["topic_config"]),
    ("broker settings", &["config"]),
    ("Kafka's config catalog", &["config_catalog"]),
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::LAYERS;

    fn layer_of(module: &str) -> Option<usize> {
        LAYERS.iter().position(|(_, ms)| ms.contains(&module))
    }

    /// The top-level module a file of `src/` belongs to.
    fn module_of(relative: &Path) -> String {
        let first = relative.components().next().expect("a path");
        let name = first.as_os_str().to_string_lossy();
        name.trim_end_matches(".rs").to_string()
    }

    /// The text without `//` comments (a string holding `//` loses its tail, which only hides
    /// text, never adds a path).
    fn without_comments(text: &str) -> String {
        text.lines()
            .map(|l| l.find("//").map_or(l, |i| &l[..i]))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The top-level modules `text` names through `crate::`: `crate::a::..`, and each item of
    /// `crate::{a::.., b}`.
    fn referenced(text: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let ident = |s: &str| -> String {
            s.trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        };
        let mut rest = text;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // Items at depth 0 of the braces.
                let (mut depth, mut start) = (0usize, 0usize);
                for (j, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            out.insert(ident(&group[start..j]));
                            break;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            out.insert(ident(&group[start..j]));
                            start = j + 1;
                        }
                        _ => {}
                    }
                }
            } else {
                out.insert(ident(rest));
            }
        }
        out.remove("");
        out
    }

    fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("src is readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn modules_only_use_the_layers_below_their_own() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&src, &mut files);
        files.sort();
        let mut wrong = Vec::new();
        let mut edges = BTreeSet::new();
        for file in &files {
            let relative = file.strip_prefix(&src).expect("under src");
            if relative == Path::new("layers.rs") {
                continue; // this file's own examples
            }
            let module = module_of(relative);
            let Some(own) = layer_of(&module) else {
                wrong.push(format!(
                    "{}: module {module} is in no layer",
                    relative.display()
                ));
                continue;
            };
            let text = std::fs::read_to_string(file).expect("readable");
            for used in referenced(&without_comments(&text)) {
                if used == module {
                    continue;
                }
                edges.insert((module.clone(), used.clone()));
                match layer_of(&used) {
                    None => wrong.push(format!(
                        "{}: uses crate::{used}, a module in no layer",
                        relative.display()
                    )),
                    Some(theirs) if theirs <= own => wrong.push(format!(
                        "{}: {module} ({}) uses crate::{used} ({}), which is not below it",
                        relative.display(),
                        LAYERS[own].0,
                        LAYERS[theirs].0
                    )),
                    Some(_) => {}
                }
            }
        }
        // The reader finds what is there: a handler reaches its shard, the shard its groups.
        for (from, to) in [
            ("handlers", "shard"),
            ("shard", "group"),
            ("net", "handlers"),
        ] {
            assert!(
                edges.contains(&(from.to_string(), to.to_string())),
                "{from} -> {to} not found: {edges:?}"
            );
        }
        assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
    }

    #[test]
    fn paths_are_read_in_every_form() {
        let text = "use crate::a::B;\nuse crate::{b::C, d, e::{F, G}};\nlet x = crate::h::i();";
        let found: Vec<String> = referenced(text).into_iter().collect();
        assert_eq!(found, ["a", "b", "d", "e", "h"]);
        assert!(referenced(&without_comments("// crate::z::y\nfn f() {}")).is_empty());
    }
}
