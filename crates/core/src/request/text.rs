//! Character scans over whole prompts, eight bytes at a time: the filter runs as wasm32, where
//! the standard library's word-at-a-time loops use 4-byte words (and walking characters one by
//! one is slower still), and a prompt can be a megabyte long. Results are exactly the standard
//! library's.

const WORD: usize = 8;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

fn word_at(bytes: &[u8], at: usize) -> Option<u64> {
    let chunk: [u8; WORD] = bytes.get(at..at.checked_add(WORD)?)?.try_into().ok()?;
    Some(u64::from_le_bytes(chunk))
}

/// The length of the longest all-ASCII start of `bytes`, rounded down to whole words.
fn ascii_words_len(bytes: &[u8]) -> usize {
    let mut at = 0;
    while let Some(word) = word_at(bytes, at) {
        if word & HIGH_BITS != 0 {
            break;
        }
        at += WORD;
    }
    at
}

/// The number of characters in `text`. Natively the standard library's count is vectorised
/// and faster; this loop is for wasm32.
#[cfg(not(target_arch = "wasm32"))]
pub fn char_count(text: &str) -> usize {
    text.chars().count()
}

/// The number of characters in `text`: its bytes less its UTF-8 continuation bytes.
#[cfg(any(target_arch = "wasm32", test))]
fn count_by_words(text: &str) -> usize {
    let bytes = text.as_bytes();
    let mut continuation = 0;
    let mut at = 0;
    while let Some(word) = word_at(bytes, at) {
        // A continuation byte is 0b10xxxxxx: its high bit set and the next one clear.
        continuation += (word & !(word << 1) & HIGH_BITS).count_ones() as usize;
        at += WORD;
    }
    let tail = bytes.get(at..).unwrap_or_default();
    continuation += tail.iter().filter(|&&b| b & 0xc0 == 0x80).count();
    bytes.len() - continuation
}

#[cfg(target_arch = "wasm32")]
pub fn char_count(text: &str) -> usize {
    count_by_words(text)
}

/// The byte offset just past the first `chars` characters of `text`, `None` if it has fewer
/// than `chars + 1` (so the offset is a char boundary short of the end).
pub fn offset_of_char(text: &str, chars: usize) -> Option<usize> {
    // Only the first `chars + 1` bytes can hold the answer's ASCII run: a long prompt's tail
    // is left to the count.
    let bytes = text.as_bytes();
    let head = bytes.get(..chars.saturating_add(1)).unwrap_or(bytes);
    let ascii = ascii_words_len(head);
    if chars < ascii {
        return Some(chars);
    }
    // The ASCII start holds one character per byte: walk only what follows it.
    let rest = text.get(ascii..)?;
    rest.char_indices()
        .nth(chars - ascii)
        .map(|(offset, _)| ascii + offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    const SAMPLES: [&str; 7] = [
        "",
        "plain ascii text that runs past a few words",
        "€uro first, then ascii for a while longer",
        "ascii for sixteen€ then more text",
        "日本語のテキストです、長い文章。",
        "mixed: ünïcödé and 🙂 emoji and ascii",
        "x",
    ];

    #[test]
    fn counts_like_the_standard_library() {
        for text in SAMPLES {
            assert_eq!(count_by_words(text), text.chars().count(), "{text:?}");
            assert_eq!(char_count(text), text.chars().count(), "{text:?}");
        }
    }

    #[test]
    fn offsets_like_the_standard_library() {
        for text in SAMPLES {
            for chars in 0..text.len() + 2 {
                let expected = text.char_indices().nth(chars).map(|(offset, _)| offset);
                assert_eq!(offset_of_char(text, chars), expected, "{text:?} {chars}");
            }
        }
    }
}
