//! A deterministic stand-in for a BPE tokenizer, and the chat template.
//!
//! Tokens are word pieces of varying length, roughly as a Llama 3 tokenizer cuts English:
//! - a letter word with the single space before it is one token when it has at most 7
//!   characters (` system`, ` the`); a longer one is cut into pieces of 2 to 6 characters, the
//!   lengths drawn from a hash of the word (so the same word always splits the same way);
//! - digits go in groups of up to 3; a run of punctuation (up to 3, with the space before it)
//!   is one token; a run of newlines is one token, as is any other run of whitespace;
//! - the special tokens of the chat template (`<|begin_of_text|>`, ...) are one token each.
//!
//! A token's id is a hash of its text below [`VOCAB`], so equal text gives equal ids. English
//! prose comes out at 4 to 5 characters per token, but never at a fixed ratio: a prefix of N
//! characters is not N/4 tokens, which is what a picker that counts characters has to live with.

/// Ids below this are ordinary tokens; the special tokens sit above, as in Llama 3.
pub const VOCAB: u32 = 128_000;
pub const BEGIN_OF_TEXT: u32 = 128_000;
pub const START_HEADER: u32 = 128_006;
pub const END_HEADER: u32 = 128_007;
pub const END_OF_TURN: u32 = 128_009;

const SPECIAL: [(&str, u32); 4] = [
    ("<|begin_of_text|>", BEGIN_OF_TEXT),
    ("<|start_header_id|>", START_HEADER),
    ("<|end_header_id|>", END_HEADER),
    ("<|eot_id|>", END_OF_TURN),
];

/// Longest ordinary word (with its leading space) kept as one token.
const WHOLE_WORD_CHARS: usize = 7;

/// 64-bit FNV-1a.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// A piece's id: its bytes packed little-endian (up to 8; longer pieces are hashed), tagged
/// with its length, mixed. `text[start..start + len]` is the piece.
fn piece_id(text: &[u8], start: usize, len: usize) -> u32 {
    let hash = if len <= 8 {
        let packed = match text.get(start..start + 8) {
            // Branch-free for pieces with 8 bytes of text after their start (nearly all).
            Some(window) => {
                let word = u64::from_le_bytes(window.try_into().unwrap_or_default());
                word & (u64::MAX >> (64 - 8 * len.max(1)))
            }
            None => text[start..start + len]
                .iter()
                .rev()
                .fold(0, |word, &byte| (word << 8) | u64::from(byte)),
        };
        mix(packed ^ ((len as u64) << 60))
    } else {
        fnv1a(&text[start..start + len])
    };
    (hash % u64::from(VOCAB)) as u32
}

/// splitmix64's finaliser.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Tokenizes `text`, reading the chat template's special tokens as single tokens.
pub fn encode(text: &str, out: &mut Vec<u32>) {
    let mut rest = text;
    while let Some(at) = rest.find("<|") {
        match SPECIAL
            .iter()
            .find(|(marker, _)| rest[at..].starts_with(marker))
        {
            Some((marker, id)) => {
                encode_ordinary(&rest[..at], out);
                out.push(*id);
                rest = &rest[at + marker.len()..];
            }
            None => {
                encode_ordinary(&rest[..at + 2], out);
                rest = &rest[at + 2..];
            }
        }
    }
    encode_ordinary(rest, out);
}

/// Tokenizes text with no special tokens.
pub fn encode_ordinary(text: &str, out: &mut Vec<u32>) {
    let base = text.as_ptr() as usize;
    let bytes = text.as_bytes();
    for_each_piece(text, |piece| {
        out.push(piece_id(bytes, piece.as_ptr() as usize - base, piece.len()))
    });
}

/// The pieces `text` is cut into.
#[cfg(test)]
pub fn pieces(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    for_each_piece(text, |piece| pieces.push(piece));
    pieces
}

#[derive(Clone, Copy, PartialEq)]
enum Class {
    Letter,
    Digit,
    Newline,
    Space,
    Other,
}

fn class(c: char) -> Class {
    if c.is_alphabetic() {
        Class::Letter
    } else if c.is_numeric() {
        Class::Digit
    } else if c == '\n' || c == '\r' {
        Class::Newline
    } else if c.is_whitespace() {
        Class::Space
    } else {
        Class::Other
    }
}

/// The character at byte `at` and its length in bytes.
fn char_at(text: &str, at: usize) -> Option<(char, usize)> {
    let byte = *text.as_bytes().get(at)?;
    if byte.is_ascii() {
        return Some((char::from(byte), 1));
    }
    let c = text[at..].chars().next()?;
    Some((c, c.len_utf8()))
}

fn for_each_piece<'a>(text: &'a str, mut emit: impl FnMut(&'a str)) {
    let class_at = |at: usize| char_at(text, at).map(|(c, _)| class(c));
    // End of the run of `of` from `from`, at most `max` characters: (byte end, characters).
    let bytes = text.as_bytes();
    let run_end = |from: usize, of: Class, max: usize| {
        let (mut at, mut count) = (from, 0);
        if of == Class::Letter {
            // The common case, byte by byte.
            while count < max && at < bytes.len() && bytes[at].is_ascii_alphabetic() {
                at += 1;
                count += 1;
            }
        }
        while count < max {
            match char_at(text, at) {
                Some((c, len)) if class(c) == of => {
                    at += len;
                    count += 1;
                }
                _ => break,
            }
        }
        (at, count)
    };
    let mut at = 0;
    while let Some((c, len)) = char_at(text, at) {
        // A single space joins the word or punctuation that follows it.
        let (body, body_class) = match (c, class_at(at + len)) {
            (' ', Some(next @ (Class::Letter | Class::Other))) => (at + 1, next),
            _ => (at, class(c)),
        };
        let (end, count) = match body_class {
            Class::Letter | Class::Newline => run_end(body, body_class, usize::MAX),
            Class::Digit | Class::Other => run_end(body, body_class, 3),
            Class::Space => {
                // Leave a final space to the word or punctuation after the run.
                let (end, count) = run_end(body, Class::Space, usize::MAX);
                let gives_last = count > 1
                    && bytes[end - 1] == b' '
                    && matches!(class_at(end), Some(Class::Letter | Class::Other));
                if gives_last {
                    (end - 1, count - 1)
                } else {
                    (end, count)
                }
            }
        };
        let piece = &text[at..end];
        let chars = count + usize::from(body != at);
        if body_class == Class::Letter && chars > WHOLE_WORD_CHARS {
            split_word(piece, &mut emit);
        } else {
            emit(piece);
        }
        at = end;
    }
}

/// Cuts a long word into pieces of 2 to 6 characters, lengths drawn from the word's hash.
fn split_word<'a>(word: &'a str, emit: &mut impl FnMut(&'a str)) {
    // Seeded by the word's length and first 64 bytes: a long word costs one pass, not two.
    let head = &word.as_bytes()[..word.len().min(64)];
    let seed = mix(fnv1a(head) ^ word.len() as u64) | 1;
    if word.is_ascii() {
        split_at_bounds(word, word.len(), seed, |i| i, emit);
    } else {
        let bounds: Vec<usize> = word
            .char_indices()
            .map(|(at, _)| at)
            .chain([word.len()])
            .collect();
        split_at_bounds(word, bounds.len() - 1, seed, |i| bounds[i], emit);
    }
}

/// Splits `total` characters (character `i` starts at byte `bound(i)`).
fn split_at_bounds<'a>(
    word: &'a str,
    total: usize,
    mut state: u64,
    bound: impl Fn(usize) -> usize,
    emit: &mut impl FnMut(&'a str),
) {
    let mut at = 0;
    while total - at > 6 {
        // xorshift64: one draw per piece.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut len = 2 + (state % 5) as usize;
        if total - at - len < 2 {
            len = total - at - 2;
        }
        emit(&word[bound(at)..bound(at + len)]);
        at += len;
    }
    emit(&word[bound(at)..]);
}

/// One chat message, its content already flattened to text.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// The Llama 3.1 chat template (as vLLM applies it from the model's tokenizer config, without
/// tools): the system turn always present and dated, every turn wrapped in role markers, and
/// the assistant's header opened for the reply.
pub fn apply_chat_template(messages: &[Message]) -> String {
    let (system, rest) = match messages.first() {
        Some(first) if first.role == "system" => (first.content.trim(), &messages[1..]),
        _ => ("", messages),
    };
    let mut text = String::from(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n\
         Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n",
    );
    text.push_str(system);
    text.push_str("<|eot_id|>");
    for message in rest {
        text.push_str("<|start_header_id|>");
        text.push_str(&message.role);
        text.push_str("<|end_header_id|>\n\n");
        text.push_str(message.content.trim());
        text.push_str("<|eot_id|>");
    }
    text.push_str("<|start_header_id|>assistant<|end_header_id|>\n\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        encode(text, &mut out);
        out
    }

    #[test]
    fn words_digits_punctuation_and_spaces() {
        assert_eq!(
            pieces("Hello world, it's 2024!\n\nBye  now"),
            [
                "Hello", " world", ",", " it", "'", "s", " ", "202", "4", "!", "\n\n", "Bye", " ",
                " now"
            ]
        );
        assert_eq!(pieces(""), Vec::<&str>::new());
        assert_eq!(pieces("  (x)"), [" ", " (", "x", ")"]);
    }

    #[test]
    fn long_words_split_into_pieces_of_two_to_six_the_same_way_every_time() {
        let word = " internationalization";
        let split = pieces(word);
        assert!(split.len() > 3, "{split:?}");
        assert_eq!(split.concat(), word);
        assert!(split.iter().all(|p| (2..=6).contains(&p.chars().count())));
        assert_eq!(split, pieces(word));
        // Lengths vary with the word, not a fixed stride.
        let long = "x".repeat(10_000);
        let lengths: std::collections::BTreeSet<usize> =
            pieces(&long).iter().map(|p| p.len()).collect();
        assert_eq!(lengths, (2..=6).collect());
        // Non-ASCII words split on character boundaries.
        let accented = "éàüöçñøåéàüöçñøå";
        assert_eq!(pieces(accented).concat(), accented);
    }

    #[test]
    fn tokens_are_not_characters_over_four() {
        let prose = "The quick brown fox jumps over the lazy dog near the riverbank. ".repeat(20);
        let count = tokens(&prose).len();
        let per_token = prose.len() as f64 / count as f64;
        assert!((3.5..6.0).contains(&per_token), "{per_token}");
        assert_ne!(count, prose.len().div_ceil(4));
        // Equal text, equal ids wherever it stands; different text, different ids.
        assert_eq!(tokens("same words"), tokens("same words"));
        assert_eq!(tokens("abc")[0], tokens("abc defghijklmnop")[0]);
        assert_eq!(tokens(" word")[0], tokens("a word")[1]);
        assert_ne!(tokens(" alpha"), tokens(" bravo"));
        assert!(tokens(&prose).iter().all(|&id| id < VOCAB));
    }

    #[test]
    fn special_tokens_are_single_tokens() {
        let ids = tokens("<|begin_of_text|>hi<|eot_id|><|nope|>");
        assert_eq!(ids[0], BEGIN_OF_TEXT);
        assert_eq!(ids[2], END_OF_TURN);
        assert!(ids[3..].iter().all(|&id| id < VOCAB));
    }

    #[test]
    fn chat_template_wraps_turns_in_role_markers() {
        let messages = [
            Message {
                role: "system".into(),
                content: " Be brief. ".into(),
            },
            Message {
                role: "user".into(),
                content: "Hi".into(),
            },
        ];
        let text = apply_chat_template(&messages);
        assert!(text.starts_with("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"));
        assert!(text.contains(
            "2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        ));
        assert!(text.ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n"));
        // Without a system message the dated system turn is still there, empty.
        let text = apply_chat_template(&messages[1..]);
        assert!(text.contains("2024\n\n<|eot_id|><|start_header_id|>user"));
        let ids = tokens(&text);
        assert_eq!(ids[..2], [BEGIN_OF_TEXT, START_HEADER]);
        assert_eq!(ids.iter().filter(|&&id| id == END_OF_TURN).count(), 2);
    }
}
