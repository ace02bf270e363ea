//! The README's plugin table says what each plugin's own `SPEC` declares: its names, its kind,
//! the *prefix* mark exactly on the plugins that read prefix matches, and the request headers
//! it reads. A plugin added without a row, or a row left behind, fails here.

use inference_picker::scheduling::plugins::{self, Data};

/// `(first cell, kind cell, whole row)` of every row of the table under `### Plugins`.
fn table_rows(readme: &str) -> Vec<(String, String, String)> {
    let section = readme
        .split("### Plugins")
        .nth(1)
        .expect("README has a ### Plugins section");
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
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let rows = table_rows(&readme);
    assert!(rows.len() >= 30, "found only {} rows", rows.len());
    for spec in plugins::specs() {
        let (first, kind, row) = rows
            .iter()
            .find(|(first, _, _)| first.starts_with(&format!("`{}`", spec.type_name)))
            .unwrap_or_else(|| panic!("no README row for {}", spec.type_name));
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
            "README row {first:?} names no registered plugin"
        );
    }
}
