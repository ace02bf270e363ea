//! The request body's prompt-carrying values, read in one pass and borrowed from the body when
//! they hold no escapes. serde's untagged enums would buffer each value whole and then copy it
//! into the variant that fits: two copies of a prompt that can be a megabyte long.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt;

/// `prompt` / `input`: a string, or a list of strings, token ids, token-id lists or messages.
pub(super) enum Prompt<'a> {
    Text(Cow<'a, str>),
    List(Vec<Item<'a>>),
}

pub(super) enum Item<'a> {
    Text(Cow<'a, str>),
    Token(u32),
    Tokens(Vec<u32>),
    Message(Message<'a>),
}

#[derive(Deserialize)]
pub(super) struct Message<'a> {
    #[serde(borrow)]
    pub role: Cow<'a, str>,
    #[serde(default, borrow)]
    pub content: Option<Content<'a>>,
}

/// A message's `content`: a string or a list of parts (only text parts count).
pub(super) enum Content<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<Part<'a>>),
}

#[derive(Deserialize)]
pub(super) struct Part<'a> {
    #[serde(default, borrow)]
    pub text: Option<Cow<'a, str>>,
}

/// Visits the string forms shared by every value here.
macro_rules! string_visits {
    ($variant:path) => {
        fn visit_borrowed_str<E: de::Error>(self, value: &'de str) -> Result<Self::Value, E> {
            Ok($variant(Cow::Borrowed(value)))
        }

        fn visit_str<E: de::Error>(self, value: &str) -> Result<Self::Value, E> {
            Ok($variant(Cow::Owned(value.to_owned())))
        }

        fn visit_string<E: de::Error>(self, value: String) -> Result<Self::Value, E> {
            Ok($variant(Cow::Owned(value)))
        }
    };
}

/// Collects a JSON array element by element.
fn collect<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(mut seq: A) -> Result<Vec<T>, A::Error> {
    let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
    while let Some(item) = seq.next_element()? {
        items.push(item);
    }
    Ok(items)
}

impl<'de: 'a, 'a> Deserialize<'de> for Prompt<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PromptVisitor;
        impl<'de> Visitor<'de> for PromptVisitor {
            type Value = Prompt<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list")
            }

            string_visits!(Prompt::Text);

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                collect(seq).map(Prompt::List)
            }
        }
        deserializer.deserialize_any(PromptVisitor)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Item<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ItemVisitor;
        impl<'de> Visitor<'de> for ItemVisitor {
            type Value = Item<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string, a token id, a list of token ids or a message")
            }

            string_visits!(Item::Text);

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
                u32::try_from(value)
                    .map(Item::Token)
                    .map_err(|_| E::custom(format!("token id {value} is out of range")))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                collect(seq).map(Item::Tokens)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                Message::deserialize(de::value::MapAccessDeserializer::new(map)).map(Item::Message)
            }
        }
        deserializer.deserialize_any(ItemVisitor)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ContentVisitor;
        impl<'de> Visitor<'de> for ContentVisitor {
            type Value = Content<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of content parts")
            }

            string_visits!(Content::Text);

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                collect(seq).map(Content::Parts)
            }
        }
        deserializer.deserialize_any(ContentVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn strings_without_escapes_are_borrowed() {
        let body = r#"["plain", "esc\"aped"]"#;
        let Prompt::List(items) = serde_json::from_str::<Prompt>(body).unwrap() else {
            panic!("a list")
        };
        let borrowed: Vec<bool> = items
            .iter()
            .map(|item| matches!(item, Item::Text(Cow::Borrowed(_))))
            .collect();
        assert_eq!(borrowed, [true, false]);
    }

    #[test]
    fn wrong_shapes_are_errors() {
        assert!(serde_json::from_str::<Prompt>("5").is_err());
        assert!(serde_json::from_str::<Prompt>("[-1]").is_err());
        assert!(serde_json::from_str::<Prompt>("[4294967296]").is_err());
        assert!(serde_json::from_str::<Content>(r#"{"text":"x"}"#).is_err());
    }
}
