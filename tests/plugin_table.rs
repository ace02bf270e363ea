//! The plugin table of `docs/plugins.md` says what each plugin's own `SPEC` declares: its names,
//! its kind, the *prefix* mark exactly on the plugins that read prefix matches, and the request
//! headers it reads. A plugin added without a row, or a row left behind, fails here.

use inference_picker_core::scheduling::plugins::{self, Data};

/// `(first cell, kind cell, whole row)` of every row of the table under `### Plugins`.
fn table_rows(doc: &str) -> Vec<(String, String, String)> {
    let section = doc
        .split("### Plugins")
        .nth(1)
        .expect("docs/plugins.md has a ### Plugins section");
    section
        .lines()
        .skip_while(|line| !line.starts_with("| type |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.split(" | ").collect();
            (
                cells[0].trim_start_matches("| ").to_owned(),
                cells[1].to_owned(),
                line.to_owned(),
            )
        })
        .collect()
}

fn named(cell: &str, type_name: &str) -> bool {
    cell.contains(&format!("`{type_name}`"))
}

#[test]
fn every_spec_has_a_row_that_matches_its_declaration() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/plugins.md"))
        .expect("docs/plugins.md");
    let rows = table_rows(&doc);
    assert!(rows.len() >= 30, "found only {} rows", rows.len());
    for spec in plugins::specs() {
        let (first, kind, row) = rows
            .iter()
            .find(|(first, _, _)| first.starts_with(&format!("`{}`", spec.type_name)))
            .unwrap_or_else(|| panic!("no docs/plugins.md row for {}", spec.type_name));
        for alias in spec.aliases {
            assert!(
                named(first, alias),
                "{}: alias {alias} not in the row",
                spec.type_name
            );
        }
        assert!(
            kind.contains(spec.kind.label()),
            "{}: kind cell {kind:?} does not say {:?}",
            spec.type_name,
            spec.kind.label()
        );
        assert_eq!(
            kind.contains("*prefix*"),
            spec.consumes(Data::PrefixMatches),
            "{}: the *prefix* mark must match whether it reads prefix matches",
            spec.type_name
        );
        for data in spec.consumes {
            if let Data::RequestHeader(header) = data {
                assert!(
                    row.contains(header),
                    "{}: row does not name {header}",
                    spec.type_name
                );
            }
        }
    }
    for (first, _, _) in &rows {
        let type_name = first.split('`').nth(1).unwrap_or_default();
        assert!(
            plugins::spec(type_name).is_some_and(|spec| spec.type_name == type_name),
            "docs/plugins.md row {first:?} names no registered plugin"
        );
    }
}

/// `(type, status, notes)` of every row of the llm-d-router table.
fn llm_d_router_rows(doc: &str) -> Vec<(String, String, String)> {
    doc.split("### llm-d-router plugin types")
        .nth(1)
        .expect("docs/plugins.md has a ### llm-d-router plugin types section")
        .lines()
        .skip_while(|line| !line.starts_with("| llm-d-router type |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line
                .trim_start_matches("| ")
                .trim_end_matches(" |")
                .split(" | ")
                .collect();
            assert_eq!(cells.len(), 3, "{line}");
            (
                cells[0].trim_matches('`').to_owned(),
                cells[1].to_owned(),
                cells[2].to_owned(),
            )
        })
        .collect()
}

/// Each row of the llm-d-router table says what loading that type really does: registered
/// under the name, an alias of the named plugin, accepted as a plugin that does nothing (with
/// the warning text the row quotes), or refused with the reason the row quotes.
#[test]
fn every_llm_d_router_type_is_registered_aliased_accepted_or_refused_as_documented() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/plugins.md"))
        .expect("docs/plugins.md");
    let rows = llm_d_router_rows(&doc);
    assert_eq!(rows.len(), 97, "llm-d-router registers 97 plugin types");
    let mut names: Vec<&str> = rows.iter().map(|(name, _, _)| name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), rows.len(), "a type is listed twice");
    for (name, status, notes) in &rows {
        let spec = plugins::spec(name);
        let refused = plugins::not_supported(name);
        match status.as_str() {
            "supported" if notes.contains("multi-pool") && spec.is_none() => {
                // Loaded by the multi-pool configuration, which registers it.
                assert_eq!(refused, None, "{name}");
            }
            "supported" => {
                let spec = spec.unwrap_or_else(|| panic!("{name} is not registered"));
                assert_eq!(spec.type_name, name, "{name} is only an alias");
                assert_eq!(spec.done_by, None, "{name} does nothing: say so");
                assert_eq!(refused, None, "{name}");
            }
            "accepted, does nothing" => {
                let spec = spec.unwrap_or_else(|| panic!("{name} is not registered"));
                assert_eq!(spec.type_name, name, "{name} is only an alias");
                assert_eq!(
                    spec.done_by,
                    Some(notes.as_str()),
                    "{name}: the warning differs"
                );
                assert!(
                    plugins::build(name, &serde_yaml::Value::Null).is_ok(),
                    "{name}"
                );
            }
            "not supported" => {
                assert_eq!(refused, Some(notes.as_str()), "{name}: the reason differs");
                assert!(spec.is_none(), "{name} is refused but registered");
                let error = plugins::build(name, &serde_yaml::Value::Null).unwrap_err();
                assert!(error.contains(name.as_str()) && error.contains(notes.as_str()));
            }
            alias => {
                let target = alias
                    .strip_prefix("alias of `")
                    .and_then(|rest| rest.strip_suffix('`'))
                    .unwrap_or_else(|| panic!("{name}: unknown status {alias:?}"));
                let spec = spec.unwrap_or_else(|| panic!("{name} is not registered"));
                assert_eq!(spec.type_name, target, "{name}");
                assert_ne!(target, name);
            }
        }
    }
    for (refused, _) in plugins::refused_types() {
        assert!(
            rows.iter().any(|(name, _, _)| name == refused),
            "{refused} is refused but not in the llm-d-router table of docs/plugins.md"
        );
    }
}
