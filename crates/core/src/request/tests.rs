//! Unit tests of request parsing: paths, the bodies of every API kind, client errors, the
//! model rewrite and the prompt text kept for the prefix index.

use super::*;
use crate::harness::test;

fn parse(kind: ApiKind, body: &str) -> Result<InferenceRequest, RequestError> {
    parse_body(kind, body.as_bytes())
}

#[test]
fn paths() {
    let api = |path: &str| ApiKind::from_path(path.as_bytes());
    assert_eq!(api("/v1/completions"), ApiKind::Completions);
    assert_eq!(api("/v1/chat/completions?x=1"), ApiKind::ChatCompletions);
    assert_eq!(api("/v1/embeddings/"), ApiKind::Embeddings);
    assert_eq!(api("/v1/responses"), ApiKind::Responses);
    assert_eq!(api("/v1/messages"), ApiKind::Messages);
    assert_eq!(api("/v1/%6dessages/"), ApiKind::Messages);
    assert_eq!(api("/v1/messages/count_tokens"), ApiKind::Other);
    assert_eq!(api("/v1/models"), ApiKind::Other);
    // Every spelling a server would route to an inference API is one.
    for spelling in [
        "/v1/%63ompletions",
        "/v1/Completions%2F..%2Fcompletions",
        "//v1//completions",
        "/v1/./completions/",
        "/x/../v1/completions",
        "/v1%2Fcompletions",
        "/%76%31/%63%6f%6d%70%6c%65%74%69%6f%6e%73?stream=1",
    ] {
        assert_eq!(api(spelling), ApiKind::Completions, "{spelling}");
    }
    assert_eq!(api("/v1/completions%"), ApiKind::Other);
    assert_eq!(
        api("/v1/%2563ompletions"),
        ApiKind::Other,
        "decoded once, as servers do"
    );
    assert_eq!(api("/../../v1/chat/completions"), ApiKind::ChatCompletions);
}

#[test]
fn plain_paths_are_not_copied() {
    assert!(matches!(
        normalized_path(b"/v1/completions?x"),
        Cow::Borrowed(b"/v1/completions")
    ));
    assert_eq!(normalized_path(b"/").as_ref(), b"");
    assert_eq!(normalized_path(b"/a%zz/b%4").as_ref(), b"/a%zz/b%4");
}

#[test]
fn completions_prompt_string_and_list() {
    let request = parse(
        ApiKind::Completions,
        r#"{"model":"m","prompt":"Hello world!","max_tokens":8}"#,
    )
    .unwrap();
    assert_eq!(request.model, "m");
    assert_eq!(request.prompt, "Hello world!");
    assert_eq!((request.prompt_chars, request.prompt_tokens), (12, 3));
    assert_eq!(request.max_tokens, Some(8));
    let request = parse(
        ApiKind::Completions,
        r#"{"model":"m","prompt":["ab","cd"]}"#,
    )
    .unwrap();
    assert_eq!(request.prompt, "abcd");
    let request = parse(ApiKind::Completions, r#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
    assert_eq!(request.prompt_tokens, 3);
}

#[test]
fn chat_messages_string_and_parts() {
    let body = r#"{"model":"m","stream":true,"max_completion_tokens":5,"messages":[
            {"role":"system","content":"Be brief."},
            {"role":"user","content":[{"type":"text","text":"Hi "},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"there"}]},
            {"role":"assistant","content":null}]}"#;
    let request = parse(ApiKind::ChatCompletions, body).unwrap();
    assert_eq!(
        request.prompt,
        "system: Be brief.\nuser: Hi there\nassistant: \n"
    );
    assert!(request.stream);
    assert_eq!(request.max_tokens, Some(5));
    assert_eq!(
        request.system_chars,
        Some("system: Be brief.\n".len()),
        "the system prompt ends where the user's turn begins"
    );
    let unprompted = r#"{"model":"m","messages":[{"role":"user","content":"Hi"}]}"#;
    let request = parse(ApiKind::ChatCompletions, unprompted).unwrap();
    assert_eq!(request.system_chars, None, "no system prompt");
}

#[test]
fn embeddings_and_responses() {
    let request = parse(ApiKind::Embeddings, r#"{"model":"e","input":["a","b"]}"#).unwrap();
    assert_eq!(request.prompt, "ab");
    let body = r#"{"model":"r","instructions":"Be kind.","input":[{"role":"user","content":[{"type":"input_text","text":"Hey"}]}],"max_output_tokens":9}"#;
    let request = parse(ApiKind::Responses, body).unwrap();
    assert_eq!(request.prompt, "system: Be kind.\nuser: Hey\n");
    assert_eq!(request.opening_chars, None, "no assistant turn yet");
    assert_eq!(request.system_chars, Some("system: Be kind.\n".len()));
    assert_eq!(request.max_tokens, Some(9));
    let request = parse(ApiKind::Responses, r#"{"model":"r","input":"plain"}"#).unwrap();
    assert_eq!(request.prompt, "plain");
}

#[test]
fn messages_with_a_string_system_prompt() {
    let body = r#"{"model":"claude","max_tokens":64,"stream":true,"system":"Be brief.",
            "messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello"}]}"#;
    let request = parse(ApiKind::Messages, body).unwrap();
    assert_eq!(request.model, "claude");
    assert_eq!(
        request.prompt,
        "system: Be brief.\nuser: Hi\nassistant: Hello\n"
    );
    assert_eq!(request.max_tokens, Some(64));
    assert!(request.stream);
    assert_eq!(
        request.opening_chars,
        Some("system: Be brief.\nuser: Hi\n".len()),
        "the conversation's opening ends where the assistant's first turn begins"
    );
    assert_eq!(request.system_chars, Some("system: Be brief.\n".len()));
    assert_eq!(
        request.prompt_tokens,
        u32::try_from(request.prompt.len().div_ceil(CHARS_PER_TOKEN)).unwrap()
    );
}

#[test]
fn messages_prompt_is_the_chat_prompt_of_the_same_conversation() {
    let messages = r#"[{"role":"user","content":[
            {"type":"text","text":"Look at "},
            {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},
            {"type":"text","text":"this","cache_control":{"type":"ephemeral"}}]},
            {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{"a":[1,{"b":2}]}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"ok"}]}]}]"#;
    let anthropic = format!(
        r#"{{"model":"m","max_tokens":8,"system":[{{"type":"text","text":"Long "}},{{"type":"text","text":"rules."}}],"messages":{messages}}}"#
    );
    let request = parse(ApiKind::Messages, &anthropic).unwrap();
    assert_eq!(
        request.prompt,
        "system: Long rules.\nuser: Look at this\nassistant: \nuser: \n"
    );
    assert!(!request.stream);
    // The same turns as a chat request render the same text, so they hash to the same blocks.
    let chat = r#"{"model":"m","messages":[{"role":"system","content":"Long rules."}]}"#;
    let chat = parse(ApiKind::ChatCompletions, chat).unwrap();
    assert!(request.prompt.starts_with(&chat.prompt));
}

#[test]
fn messages_client_errors() {
    let cases = [
        (
            r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#,
            "\"max_tokens\"",
        ),
        (r#"{"model":"m","max_tokens":5}"#, "\"messages\""),
        (
            r#"{"model":"m","max_tokens":5,"messages":[]}"#,
            "at least one",
        ),
        (
            r#"{"max_tokens":5,"messages":[{"role":"user","content":"x"}]}"#,
            "\"model\"",
        ),
        (
            r#"{"model":"m","max_tokens":-1,"messages":[{"role":"user","content":"x"}]}"#,
            "invalid value",
        ),
        (
            r#"{"model":"m","max_tokens":5,"system":7,"messages":[{"role":"user","content":"x"}]}"#,
            "invalid type",
        ),
        ("{not json", "not valid"),
    ];
    for (body, needle) in cases {
        let error = parse(ApiKind::Messages, body).unwrap_err();
        assert_eq!(error.status(), 400, "{body}");
        assert!(
            error.message().contains(needle),
            "{body}: {}",
            error.message()
        );
    }
    let error = parse(ApiKind::Messages, "{not json").unwrap_err();
    let json: serde_json::Value =
        serde_json::from_slice(&error.to_json_for(ApiKind::Messages.error_shape())).unwrap();
    assert_eq!(json["type"], "error");
    assert_eq!(json["error"]["type"], "invalid_request_error");
    assert_eq!(ApiKind::Completions.error_shape(), ErrorShape::OpenAi);
}

#[test]
fn client_errors_are_400_with_a_reason() {
    let cases = [
        (ApiKind::Completions, "{not json", "not valid"),
        (ApiKind::Completions, r#"{"prompt":"x"}"#, "\"model\""),
        (
            ApiKind::Completions,
            r#"{"model":"","prompt":"x"}"#,
            "empty",
        ),
        (
            ApiKind::Completions,
            r#"{"model":5,"prompt":"x"}"#,
            "invalid type",
        ),
        (
            ApiKind::ChatCompletions,
            r#"{"model":"m","messages":{}}"#,
            "not valid",
        ),
        (ApiKind::ChatCompletions, r#"{"model":"m"}"#, "\"messages\""),
        (ApiKind::Embeddings, r#"{"model":"m"}"#, "\"input\""),
        (ApiKind::Completions, "", "empty"),
        (ApiKind::Completions, "[1,2]", "not valid"),
        (
            ApiKind::Completions,
            r#"{"model":"m","prompt":["a",1]}"#,
            "must be a string",
        ),
        (
            ApiKind::Embeddings,
            r#"{"model":"m","input":[{"role":"user","content":"x"}]}"#,
            "must be a string",
        ),
    ];
    for (kind, body, needle) in cases {
        let error = parse(kind, body).unwrap_err();
        assert_eq!(error.status(), 400, "{body}");
        assert!(
            error.message().contains(needle),
            "{body}: {}",
            error.message()
        );
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let deep = |field: &str| {
        format!(
            r#"{{"model":"m","prompt":"x","{field}":{}{}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        )
    };
    // In a field the picker reads: the wrong type three levels down.
    let body = deep("prompt").replacen(r#""prompt":"x","#, "", 1);
    let error = parse(ApiKind::Completions, &body).unwrap_err();
    assert_eq!(error.status(), 400);
    assert!(
        error.message().contains("invalid type"),
        "{}",
        error.message()
    );
    // In a field it does not read: skipped without recursion, and left to the model server.
    assert!(parse(ApiKind::Completions, &deep("extra")).is_ok());
}

#[test]
fn model_rewrite_keeps_every_other_field() {
    let body = br#"{"model":"a","prompt":"p","max_tokens":3,"extra":{"k":[1]}}"#;
    let rewritten = rewrite_model(body, "b").unwrap();
    let value: serde_json::Value = serde_json::from_slice(&rewritten).unwrap();
    assert_eq!(value["model"], "b");
    assert_eq!(value["max_tokens"], 3);
    assert_eq!(value["extra"]["k"][0], 1);
    let request = parse_body(ApiKind::Completions, &rewritten).unwrap();
    assert_eq!(request.model, "b");
    assert_eq!(request.total_tokens(), 1 + 3);
}

#[test]
fn only_the_prompt_text_the_index_reads_is_kept_but_every_char_counts() {
    let body = r#"{"model":"m","messages":[{"role":"system","content":"ééééé"},{"role":"user","content":"abcdefghij"}]}"#;
    let full = parse_body(ApiKind::ChatCompletions, body.as_bytes()).unwrap();
    for keep in [0, 3, 9, 10, 11, full.prompt_chars, full.prompt_chars + 5] {
        let kept = parse_body_keeping(ApiKind::ChatCompletions, body.as_bytes(), keep).unwrap();
        assert_eq!(kept.prompt_chars, full.prompt_chars, "keep {keep}");
        assert_eq!(kept.prompt_tokens, full.prompt_tokens);
        let expected: String = full.prompt.chars().take(keep).collect();
        assert_eq!(
            kept.prompt, expected,
            "keep {keep}: a prefix, cut at a char boundary"
        );
    }
    let ids = r#"{"model":"m","prompt":[1,22,333]}"#;
    let kept = parse_body_keeping(ApiKind::Completions, ids.as_bytes(), 4).unwrap();
    assert_eq!((kept.prompt.as_str(), kept.prompt_tokens), ("1 22", 3));
}
