//! `wasm-exports drop FILE NAME...`: rewrites FILE without the named exports (names it does not
//! export are ignored, so running it twice changes nothing); `wasm-exports list FILE` prints
//! every export. Only the export section changes; the functions stay in the module.

use std::process::ExitCode;

const MAGIC: &[u8; 8] = b"\0asm\x01\0\0\0";
const EXPORT_SECTION: u8 = 7;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [command, file] if command == "list" => list(file),
        [command, file, names @ ..] if command == "drop" => drop_exports(file, names),
        _ => Err("usage: wasm-exports list FILE | wasm-exports drop FILE NAME...".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("wasm-exports: {error}");
            ExitCode::FAILURE
        }
    }
}

fn list(file: &str) -> Result<(), String> {
    let module = std::fs::read(file).map_err(|e| format!("{file}: {e}"))?;
    for export in exports(&module)? {
        println!("{}", String::from_utf8_lossy(export.name));
    }
    Ok(())
}

fn drop_exports(file: &str, names: &[String]) -> Result<(), String> {
    let module = std::fs::read(file).map_err(|e| format!("{file}: {e}"))?;
    let rewritten = without_exports(&module, names)?;
    if rewritten != module {
        std::fs::write(file, rewritten).map_err(|e| format!("{file}: {e}"))?;
    }
    Ok(())
}

struct Export<'a> {
    name: &'a [u8],
    /// The entry as encoded: name, kind and index.
    bytes: &'a [u8],
}

/// A module's sections as `(id, payload)`, in order.
fn sections(module: &[u8]) -> Result<Vec<(u8, &[u8])>, String> {
    let mut rest = module
        .strip_prefix(MAGIC.as_slice())
        .ok_or("not a wasm module (version 1)")?;
    let mut sections = Vec::new();
    while let Some((&id, after_id)) = rest.split_first() {
        let (size, after_size) = read_leb(after_id)?;
        let size = usize::try_from(size).map_err(|_| "section too large")?;
        let payload = after_size.get(..size).ok_or("truncated section")?;
        sections.push((id, payload));
        rest = &after_size[size..];
    }
    Ok(sections)
}

fn exports(module: &[u8]) -> Result<Vec<Export<'_>>, String> {
    let Some((_, payload)) = sections(module)?
        .into_iter()
        .find(|(id, _)| *id == EXPORT_SECTION)
    else {
        return Ok(Vec::new());
    };
    let (count, mut rest) = read_leb(payload)?;
    let mut entries = Vec::new();
    for _ in 0..count {
        let start = rest;
        let (name_len, after_len) = read_leb(rest)?;
        let name_len = usize::try_from(name_len).map_err(|_| "name too long")?;
        let name = after_len.get(..name_len).ok_or("truncated export name")?;
        let after_kind = after_len.get(name_len + 1..).ok_or("truncated export")?;
        let (_, after_index) = read_leb(after_kind)?;
        let used = start.len() - after_index.len();
        entries.push(Export {
            name,
            bytes: &start[..used],
        });
        rest = after_index;
    }
    Ok(entries)
}

fn without_exports(module: &[u8], names: &[String]) -> Result<Vec<u8>, String> {
    let kept: Vec<Export> = exports(module)?
        .into_iter()
        .filter(|export| !names.iter().any(|name| name.as_bytes() == export.name))
        .collect();
    let mut out = MAGIC.to_vec();
    for (id, payload) in sections(module)? {
        let rewritten;
        let payload = if id == EXPORT_SECTION {
            let mut section = leb(kept.len() as u64);
            kept.iter().for_each(|e| section.extend_from_slice(e.bytes));
            rewritten = section;
            rewritten.as_slice()
        } else {
            payload
        };
        out.push(id);
        out.extend(leb(payload.len() as u64));
        out.extend_from_slice(payload);
    }
    Ok(out)
}

/// An unsigned LEB128 number and the bytes after it.
fn read_leb(bytes: &[u8]) -> Result<(u64, &[u8]), String> {
    let mut value = 0u64;
    for (index, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Ok((value, &bytes[index + 1..]));
        }
    }
    Err("bad LEB128 number".into())
}

fn leb(mut value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A module with one custom section and exports `a` (func 0), `keep` (func 1) and a
    /// 200-byte name (a two-byte LEB length).
    fn module() -> Vec<u8> {
        let long = "x".repeat(200);
        let mut exports = leb(3);
        for (name, index) in [("a", 0u64), ("keep", 1), (long.as_str(), 2)] {
            exports.extend(leb(name.len() as u64));
            exports.extend_from_slice(name.as_bytes());
            exports.push(0);
            exports.extend(leb(index));
        }
        let mut module = MAGIC.to_vec();
        for (id, payload) in [(0u8, b"\x04nameabc".to_vec()), (EXPORT_SECTION, exports)] {
            module.push(id);
            module.extend(leb(payload.len() as u64));
            module.extend(payload);
        }
        module
    }

    fn names(module: &[u8]) -> Vec<String> {
        exports(module)
            .unwrap()
            .iter()
            .map(|e| String::from_utf8_lossy(e.name).into_owned())
            .collect()
    }

    #[test]
    fn drops_only_the_named_exports_and_keeps_other_sections() {
        let module = module();
        let dropped = without_exports(&module, &["a".into(), "absent".into()]).unwrap();
        assert_eq!(names(&dropped), ["keep".to_string(), "x".repeat(200)]);
        assert_eq!(
            sections(&dropped).unwrap()[0],
            sections(&module).unwrap()[0]
        );
        let again = without_exports(&dropped, &["a".into()]).unwrap();
        assert_eq!(again, dropped, "dropping twice changes nothing");
        assert_eq!(without_exports(&module, &[]).unwrap(), module);
    }

    #[test]
    fn refuses_what_is_not_a_module() {
        assert!(exports(b"not wasm").is_err());
        let mut truncated = module();
        truncated.truncate(truncated.len() - 3);
        assert!(exports(&truncated).is_err());
    }

    #[test]
    fn leb_round_trips() {
        for value in [0, 1, 127, 128, 300, 16_384, u64::from(u32::MAX)] {
            let bytes = leb(value);
            assert_eq!(read_leb(&bytes).unwrap(), (value, &[][..]));
        }
    }
}
