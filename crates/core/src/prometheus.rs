//! Prometheus text exposition format (version 0.0.4) parser.
//!
//! Streams samples to a visitor without building a tree: a scrape is parsed once per tick per
//! pod, so it allocates nothing unless a label value carries escapes. Malformed lines are
//! skipped and counted, never fatal: a model server that prints garbage cannot break the picker.

use std::borrow::Cow;

/// One sample line: `name{labels} value [timestamp]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    /// The raw text between the braces, already validated.
    raw_labels: &'a str,
    pub value: f64,
    pub timestamp_ms: Option<i64>,
}

impl<'a> Sample<'a> {
    /// The value of one label, unescaped.
    pub fn label(&self, key: &str) -> Option<Cow<'a, str>> {
        self.labels()
            .find(|(name, _)| *name == key)
            .map(|(_, value)| value)
    }

    /// All labels in order, values unescaped.
    pub fn labels(&self) -> Labels<'a> {
        Labels {
            rest: self.raw_labels,
        }
    }

    /// True when every `(key, value)` pair is present with that exact value.
    pub fn matches_labels<'k>(&self, wanted: impl IntoIterator<Item = (&'k str, &'k str)>) -> bool {
        wanted
            .into_iter()
            .all(|(key, value)| self.label(key).is_some_and(|found| found == value))
    }
}

/// What a parse saw, for logs and stats: among the series read (a named parse passes the
/// others over unparsed, broken or not).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ParseSummary {
    pub samples: usize,
    /// Lines of the series read that did not parse, and lines with no metric name.
    pub malformed_lines: usize,
    /// The text was longer than the limit; nothing past it was read.
    pub truncated: bool,
}

/// Calls `visit` for every well-formed sample in `text`.
pub fn for_each_sample<'a>(text: &'a str, visit: impl FnMut(&Sample<'a>)) -> ParseSummary {
    for_each_sample_within(text, usize::MAX, visit)
}

/// Calls `visit` for every well-formed sample in the first `max_bytes` of `text`: only lines
/// that end within the limit are read, and the summary says when the text went on.
pub fn for_each_sample_within<'a>(
    text: &'a str,
    max_bytes: usize,
    visit: impl FnMut(&Sample<'a>),
) -> ParseSummary {
    for_each_named_sample_within(text, max_bytes, |_| true, visit)
}

/// [`for_each_sample_within`] for the samples whose name `wanted` accepts. Any other line is
/// passed over once its name is read, its labels and value never parsed (nor counted): most
/// of a vLLM dump is histogram buckets no scorer reads, and a scrape runs every interval.
pub fn for_each_named_sample_within<'a>(
    text: &'a str,
    max_bytes: usize,
    wanted: impl Fn(&str) -> bool,
    mut visit: impl FnMut(&Sample<'a>),
) -> ParseSummary {
    let mut summary = ParseSummary::default();
    let text = if text.len() > max_bytes {
        summary.truncated = true;
        within(text, max_bytes)
    } else {
        text
    };
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, rest) = split_name(line);
        if !name.is_empty() && !wanted(name) {
            continue;
        }
        match parse_sample(name, rest) {
            Some(sample) => {
                summary.samples += 1;
                visit(&sample);
            }
            None => summary.malformed_lines += 1,
        }
    }
    summary
}

/// The whole lines of `text` that end within its first `max_bytes` bytes.
fn within(text: &str, max_bytes: usize) -> &str {
    let end = text
        .as_bytes()
        .get(..max_bytes)
        .and_then(|head| head.iter().rposition(|&b| b == b'\n'))
        .map_or(0, |newline| newline + 1);
    // A newline is ASCII, so the cut falls on a character boundary.
    text.get(..end).unwrap_or("")
}

/// The metric name that starts `line` (empty if none does) and what follows it.
fn split_name(line: &str) -> (&str, &str) {
    // Name characters are ASCII, so the first other byte is on a character boundary.
    let name_len = line
        .bytes()
        .enumerate()
        .position(|(index, byte)| !is_name_char(char::from(byte), index == 0))
        .unwrap_or(line.len());
    line.split_at(name_len)
}

fn parse_sample<'a>(name: &'a str, rest: &'a str) -> Option<Sample<'a>> {
    if name.is_empty() {
        return None;
    }
    let (raw_labels, rest) = match rest.strip_prefix('{') {
        Some(inner) => split_labels(inner)?,
        None => ("", rest),
    };
    let mut fields = rest.split_ascii_whitespace();
    let value = parse_value(fields.next()?)?;
    let timestamp_ms = match fields.next() {
        Some(text) => Some(text.parse::<i64>().ok()?),
        None => None,
    };
    if fields.next().is_some() {
        return None;
    }
    Some(Sample {
        name,
        raw_labels,
        value,
        timestamp_ms,
    })
}

/// Splits `a="1",b="2"} rest` into the label text and what follows the closing brace,
/// validating every pair on the way.
fn split_labels(inner: &str) -> Option<(&str, &str)> {
    let mut labels = Labels { rest: inner };
    loop {
        let trimmed = labels
            .rest
            .trim_start()
            .trim_start_matches(',')
            .trim_start();
        if let Some(after) = trimmed.strip_prefix('}') {
            let consumed = inner.len() - trimmed.len();
            return Some((inner.get(..consumed)?, after));
        }
        labels.next_pair()??;
    }
}

fn is_name_char(c: char, first: bool) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':' || (!first && c.is_ascii_digit())
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ if text
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            text.parse().ok()
        }
        _ => None,
    }
}

/// Iterator over `(name, value)` label pairs.
pub struct Labels<'a> {
    rest: &'a str,
}

impl<'a> Labels<'a> {
    /// `None` at the end; `Some(None)` on a malformed pair.
    fn next_pair(&mut self) -> Option<Option<(&'a str, Cow<'a, str>)>> {
        let text = self.rest.trim_start().trim_start_matches(',').trim_start();
        if text.is_empty() || text.starts_with('}') {
            return None;
        }
        Some(self.parse_pair(text))
    }

    fn parse_pair(&mut self, text: &'a str) -> Option<(&'a str, Cow<'a, str>)> {
        let eq = text.find('=')?;
        let name = text.get(..eq)?.trim();
        if name.is_empty()
            || !name
                .chars()
                .enumerate()
                .all(|(i, c)| is_name_char(c, i == 0) && c != ':')
        {
            return None;
        }
        let quoted = text.get(eq + 1..)?.trim_start().strip_prefix('"')?;
        let (value, after) = read_quoted(quoted)?;
        let after = after.trim_start();
        if !(after.is_empty() || after.starts_with(',') || after.starts_with('}')) {
            return None;
        }
        self.rest = after;
        Some((name, value))
    }
}

impl<'a> Iterator for Labels<'a> {
    type Item = (&'a str, Cow<'a, str>);

    fn next(&mut self) -> Option<Self::Item> {
        self.next_pair().flatten()
    }
}

/// Reads a quoted label value (opening quote already consumed); returns it and the text after
/// the closing quote. Escapes `\\`, `\"` and `\n` are decoded.
fn read_quoted(text: &str) -> Option<(Cow<'_, str>, &str)> {
    let mut decoded: Option<String> = None;
    let mut chars = text.char_indices();
    while let Some((index, c)) = chars.next() {
        match c {
            '"' => {
                let value = match decoded {
                    Some(owned) => Cow::Owned(owned),
                    None => Cow::Borrowed(text.get(..index)?),
                };
                return Some((value, text.get(index + 1..)?));
            }
            '\\' => {
                let (_, escaped) = chars.next()?;
                let owned =
                    decoded.get_or_insert_with(|| text.get(..index).unwrap_or("").to_owned());
                owned.push(match escaped {
                    'n' => '\n',
                    other => other,
                });
            }
            _ => {
                if let Some(owned) = decoded.as_mut() {
                    owned.push(c);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    type Owned = (String, Vec<(String, String)>, f64, Option<i64>);

    fn samples(text: &str) -> (Vec<Owned>, ParseSummary) {
        let mut out = Vec::new();
        let summary = for_each_sample(text, |s| {
            let labels = s
                .labels()
                .map(|(k, v)| (k.to_string(), v.into_owned()))
                .collect();
            out.push((s.name.to_string(), labels, s.value, s.timestamp_ms));
        });
        (out, summary)
    }

    #[test]
    fn named_parse_reads_only_wanted_series() {
        let text = "wanted{a=\"1\"} 2\nother_bucket{le=\"0.5\"} 3\nother_bucket{le= 4\n\
                    wanted 5 6 7\n9bad 1\n";
        let mut seen = Vec::new();
        let summary = for_each_named_sample_within(
            text,
            usize::MAX,
            |name| name == "wanted",
            |sample| seen.push((sample.name, sample.value)),
        );
        assert_eq!(seen, [("wanted", 2.0)]);
        // The unwanted series is passed over, broken or not; the broken wanted line and the
        // line with no name count as malformed.
        assert_eq!(summary.samples, 1);
        assert_eq!(summary.malformed_lines, 2);
    }

    #[test]
    fn parses_vllm_exposition() {
        let text = "# HELP vllm:num_requests_waiting Number of requests waiting.\n\
                    # TYPE vllm:num_requests_waiting gauge\n\
                    vllm:num_requests_waiting{model_name=\"llama\"} 3.0\n\
                    vllm:kv_cache_usage_perc{model_name=\"llama\"} 0.25\n\
                    process_start_time_seconds 1.7e9\n";
        let (out, summary) = samples(text);
        assert_eq!(
            summary,
            ParseSummary {
                samples: 3,
                malformed_lines: 0,
                truncated: false
            }
        );
        assert_eq!(out[0].0, "vllm:num_requests_waiting");
        assert_eq!(
            out[0].1,
            vec![("model_name".to_string(), "llama".to_string())]
        );
        assert_eq!(out[0].2, 3.0);
        assert_eq!(out[2].2, 1.7e9);
        assert!(out[2].1.is_empty());
    }

    #[test]
    fn special_values_and_timestamps() {
        let (out, _) = samples("a NaN\nb +Inf 1700000000000\nc -Inf\nd{x=\"1\",} 2 -5\n");
        assert!(out[0].2.is_nan());
        assert_eq!(out[1].2, f64::INFINITY);
        assert_eq!(out[1].3, Some(1_700_000_000_000));
        assert_eq!(out[2].2, f64::NEG_INFINITY);
        assert_eq!(out[3].1, vec![("x".to_string(), "1".to_string())]);
        assert_eq!(out[3].3, Some(-5));
    }

    #[test]
    fn escaped_label_values() {
        let (out, _) = samples("m{path=\"C:\\\\dir\",msg=\"say \\\"hi\\\"\\nbye\"} 1\n");
        assert_eq!(out[0].1[0].1, "C:\\dir");
        assert_eq!(out[0].1[1].1, "say \"hi\"\nbye");
    }

    #[test]
    fn braces_and_commas_inside_values() {
        let (out, _) = samples(
            "vllm:lora_requests_info{running_lora_adapters=\"a, b\",max_lora=\"8\",x=\"}\"} 17\n",
        );
        assert_eq!(out[0].1[0].1, "a, b");
        assert_eq!(out[0].1[2].1, "}");
        assert_eq!(out[0].2, 17.0);
    }

    #[test]
    fn malformed_lines_are_skipped_not_fatal() {
        let text = "good 1\n{x=\"1\"} 2\nbad{x=1} 3\nunterminated{x=\"1} 4\nno_value\nv 1 2 3\nw abc\n9bad 1\nok{a=\"b\"} 5\n";
        let (out, summary) = samples(text);
        let names: Vec<_> = out.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(names, ["good", "ok"]);
        assert_eq!(summary.malformed_lines, 7);
    }

    #[test]
    fn label_lookup_and_matching() {
        for_each_sample("m{model_name=\"llama-3-8b\",gpu=\"0\"} 4\n", |s| {
            assert_eq!(s.label("gpu").as_deref(), Some("0"));
            assert_eq!(s.label("missing"), None);
            assert!(s.matches_labels([("model_name", "llama-3-8b")]));
            assert!(!s.matches_labels([("model_name", "other")]));
        });
    }

    /// Every line of four real vLLM 0.32.0 scrapes (`tests/fixtures/vllm/`) parses, with the
    /// labels vLLM 0.32 puts on its series.
    #[test]
    fn real_vllm_0_32_scrapes() {
        let dumps = [
            (
                include_str!("../../../tests/fixtures/vllm/vllm-0.32.0-metrics-idle.txt"),
                462,
            ),
            (
                include_str!("../../../tests/fixtures/vllm/vllm-0.32.0-metrics-busy.txt"),
                477,
            ),
            (
                include_str!("../../../tests/fixtures/vllm/vllm-0.32.0-metrics-lora-running.txt"),
                477,
            ),
            (
                include_str!("../../../tests/fixtures/vllm/vllm-0.32.0-metrics-fresh.txt"),
                430,
            ),
        ];
        for (text, count) in dumps {
            let (out, summary) = samples(text);
            assert_eq!(
                summary,
                ParseSummary {
                    samples: count,
                    malformed_lines: 0,
                    truncated: false
                }
            );
            let label = |sample: &Owned, key: &str| {
                sample
                    .1
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.clone())
            };
            let vllm: Vec<&Owned> = out.iter().filter(|s| s.0.starts_with("vllm:")).collect();
            // Every engine series carries `engine="0"` (one series per data-parallel engine);
            // the exceptions are the LoRA info and the API server's admission counters.
            for sample in &vllm {
                let engine = label(sample, "engine");
                let exempt = sample.0 == "vllm:lora_requests_info"
                    || sample.0.starts_with("vllm:admission_rejections_");
                assert!(
                    engine.as_deref() == Some("0") || (exempt && engine.is_none()),
                    "{sample:?}"
                );
            }
            let cache_config: Vec<&&Owned> = vllm
                .iter()
                .filter(|s| s.0 == "vllm:cache_config_info")
                .collect();
            assert_eq!(cache_config.len(), 1);
            assert_eq!(cache_config[0].1.len(), 37);
            assert_eq!(label(cache_config[0], "block_size").as_deref(), Some("128"));
            assert_eq!(
                label(cache_config[0], "num_gpu_blocks").as_deref(),
                Some("48")
            );
            assert_eq!(
                label(cache_config[0], "kv_cache_size_tokens").as_deref(),
                Some("6144")
            );
            let reasons: Vec<String> = vllm
                .iter()
                .filter(|s| s.0 == "vllm:num_requests_waiting_by_reason")
                .filter_map(|s| label(s, "reason"))
                .collect();
            assert_eq!(reasons, ["capacity", "deferred"]);
            // LoRA info: a timestamp as value, absent before the first request, and stale label
            // sets kept beside the current one.
            let lora: Vec<&&Owned> = vllm
                .iter()
                .filter(|s| s.0 == "vllm:lora_requests_info")
                .collect();
            assert!(lora.len() == 2 || (lora.is_empty() && count == 430));
            assert!(lora.iter().all(|s| s.2 > 1.7e9 && s.3.is_none()));
        }
    }

    #[test]
    fn stops_at_the_byte_limit() {
        let text = "a 1\nb 2\nc 3\n";
        let mut names = Vec::new();
        let summary = for_each_sample_within(text, 9, |s| names.push(s.name.to_owned()));
        assert_eq!(names, ["a", "b"], "the line cut by the limit is not read");
        assert!(summary.truncated);
        names.clear();
        let summary = for_each_sample_within(text, 3, |s| names.push(s.name.to_owned()));
        assert!(
            names.is_empty() && summary.truncated,
            "no whole line within 3 bytes"
        );
        let summary = for_each_sample_within(text, text.len(), |_| {});
        assert_eq!((summary.samples, summary.truncated), (3, false));
        let wide = "é 1\nü 2\n";
        for limit in 0..wide.len() {
            for_each_sample_within(wide, limit, |_| {});
        }
    }

    #[test]
    fn never_panics_on_arbitrary_bytes() {
        let inputs = [
            "{",
            "}",
            "a{",
            "a{b",
            "a{b=",
            "a{b=\"",
            "a{b=\"\\",
            "a{=\"x\"} 1",
            "a{b=\"x\"",
            "\u{1F600}{} 1",
            "a{b=\"x\"}} 1",
        ];
        for input in inputs {
            for_each_sample(input, |_| {});
        }
    }
}
