//! Kubernetes discovery in a real Envoy: the filter polls a local server that answers like the
//! API server's pod list; pods appear and disappear without a restart, and a failing API keeps
//! the last known pool.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{completion, eventually, free_port, picker_config_of, static_cluster, Envoy, Sim};

/// Pods the picker finds itself are not members Envoy knows: requests take the ORIGINAL_DST
/// alternative, which routes to the address the picker writes.
const CONFIG: &str = "envoy/envoy-original-dst.yaml";

/// A local stand-in for the API server: answers every request with the current status and
/// body, and remembers the request lines and authorization headers it saw.
struct FakeApi {
    address: String,
    answer: Arc<Mutex<(u16, String)>>,
    seen: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl FakeApi {
    fn start() -> FakeApi {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let answer = Arc::new(Mutex::new((200, String::from(r#"{"items":[]}"#))));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s, st) = (answer.clone(), seen.clone(), stop.clone());
        std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (a, s) = (a.clone(), s.clone());
                        std::thread::spawn(move || serve(stream, &a, &s));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeApi {
            address,
            answer,
            seen,
            stop,
        }
    }

    fn answer(&self, status: u16, body: String) {
        *self.answer.lock().unwrap() = (status, body);
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve(stream: std::net::TcpStream, answer: &Mutex<(u16, String)>, seen: &Mutex<Vec<String>>) {
    stream.set_nonblocking(false).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut request = String::new();
        if reader.read_line(&mut request).unwrap_or(0) == 0 {
            return;
        }
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                break;
            }
            if line.to_ascii_lowercase().starts_with("authorization:") {
                request.push_str(line.trim());
            }
        }
        seen.lock().unwrap().push(request);
        let (status, body) = answer.lock().unwrap().clone();
        let reply = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// A PodList with the given `(name, ip, ready)` pods, all labelled `app: vllm`.
fn pod_list(pods: &[(&str, &str, bool)]) -> String {
    let items: Vec<String> = pods
        .iter()
        .map(|(name, ip, ready)| {
            format!(
                r#"{{"metadata":{{"name":"{name}","labels":{{"app":"vllm","llm-d.ai/role":"decode"}}}},"status":{{"phase":"Running","podIP":"{ip}","conditions":[{{"type":"Ready","status":"{}"}}]}}}}"#,
                if *ready { "True" } else { "False" }
            )
        })
        .collect();
    format!(
        r#"{{"kind":"PodList","apiVersion":"v1","items":[{}]}}"#,
        items.join(",")
    )
}

/// Sends requests until one is served by `pod`, or panics after `seconds`.
fn until_served_by(envoy: &Envoy, pod: &str, seconds: u64) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut n = 0;
    loop {
        let response = envoy.post("/v1/completions", &completion(n));
        if response.status == 200 && response.pod() == pod {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{pod} never served (last: {} {})",
            response.status,
            response.text()
        );
        n += 1;
        // The polling interval of a wait for `pod`.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends ten requests (`completion(first..)`); whether `pod` served every one.
fn all_served_by(envoy: &Envoy, pod: &str, first: usize) -> bool {
    (first..first + 10).all(|n| {
        let response = envoy.post("/v1/completions", &completion(n));
        response.status == 200 && response.pod() == pod
    })
}

/// An EndpointSliceList of one slice of the `vllm` service with the given endpoints.
fn slice_list(pods: &[(&str, &str, bool)]) -> String {
    let endpoints: Vec<String> = pods
        .iter()
        .map(|(name, ip, ready)| {
            format!(
                r#"{{"addresses":["{ip}"],"conditions":{{"ready":{ready}}},"targetRef":{{"kind":"Pod","name":"{name}"}}}}"#
            )
        })
        .collect();
    format!(
        r#"{{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","items":[{{"metadata":{{"name":"vllm-abc","labels":{{"kubernetes.io/service-name":"vllm"}}}},"addressType":"IPv4","ports":[{{"name":"http","port":PORT}}],"endpoints":[{}]}}]}}"#,
        endpoints.join(",")
    )
}

#[test]
fn pods_appear_and_disappear_without_a_restart() {
    discovery_flow(
        "pods",
        "{matchLabels: {app: vllm}}",
        "/api/v1/namespaces/llm/pods?labelSelector=app%3Dvllm",
        pod_list,
    );
}

#[test]
fn endpoint_slices_appear_and_disappear_without_a_restart() {
    discovery_flow(
        "endpointslices",
        "{matchLabels: {kubernetes.io/service-name: vllm}}",
        "/apis/discovery.k8s.io/v1/namespaces/llm/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dvllm",
        slice_list,
    );
}

fn discovery_flow(
    resource: &str,
    selector: &str,
    expected_path: &str,
    list: fn(&[(&str, &str, bool)]) -> String,
) {
    let port = free_port();
    let port_text = port.to_string();
    let a = Sim::start_at(
        "pod-a",
        port,
        &["--host", "127.0.0.2", "--background-waiting", "4"],
    );
    let b = Sim::start_at("pod-b", port, &["--host", "127.0.0.3"]);
    assert_eq!(a.address, format!("127.0.0.2:{port}"));
    assert_eq!(b.address, format!("127.0.0.3:{port}"));
    let api = FakeApi::start();
    let list = |pods: &[(&str, &str, bool)]| list(pods).replace("PORT", &port_text);
    api.answer(
        200,
        list(&[("pod-a", "127.0.0.2", true), ("pod-b", "127.0.0.3", false)]),
    );

    let mut picker: serde_yaml::Value = serde_yaml::from_str(&picker_config_of(CONFIG)).unwrap();
    picker["pool"]["endpoints"] = serde_yaml::Value::Sequence(vec![]);
    picker["pool"]["discovery"] = serde_yaml::from_str(&format!(
        "{{cluster: kubernetes_api, authority: kubernetes.default.svc, namespace: llm, \
          resource: {resource}, selector: {selector}, targetPorts: [{port_text}], \
          bearerToken: test-token, interval: 200ms}}"
    ))
    .unwrap();
    let api_address = api.address.clone();
    let picker = serde_yaml::to_string(&picker).unwrap();
    let envoy = Envoy::start_from(CONFIG, &picker, 2, move |config| {
        config
            .clusters_mut()
            .push(static_cluster("kubernetes_api", &[&api_address]));
    });

    // Only pod-a is ready: it serves, despite its queue.
    until_served_by(&envoy, "pod-a", 10);
    // pod-b becomes ready: with the shorter queue, it takes the traffic.
    api.answer(
        200,
        list(&[("pod-a", "127.0.0.2", true), ("pod-b", "127.0.0.3", true)]),
    );
    until_served_by(&envoy, "pod-b", 10);
    // Found after the configuration loaded, pod-b has its stats as a listed pod has (the
    // module, which can define stats only while it loads, labels a family defined then).
    eventually("pod-b's picks in the stats", Duration::from_secs(5), || {
        envoy.endpoint_picks(&b.address) > 0
    });
    // pod-a goes away; even with its queue empty it gets nothing more.
    a.admin("load", r#"{"background_waiting":0}"#);
    api.answer(200, list(&[("pod-b", "127.0.0.3", true)]));
    assert!(
        envoy.wait_for_log_line("removed [\"127.0.0.2").is_some(),
        "{}",
        envoy.log()
    );
    // The VM that asked the API shares the new pool; each worker applies it on its next tick
    // and may send to pod-a until then.
    eventually("every worker to drop pod-a", Duration::from_secs(5), || {
        all_served_by(&envoy, "pod-b", 300)
    });
    let before = a.requests_total();
    for n in 0..10 {
        let response = envoy.post("/v1/completions", &completion(100 + n));
        assert_eq!((response.status, response.pod().as_str()), (200, "pod-b"));
    }
    assert_eq!(a.requests_total(), before);
    // The API fails: the last known pool stays.
    api.answer(500, r#"{"kind":"Status","status":"Failure"}"#.into());
    assert!(envoy
        .wait_for_log_line("keeping the last known pool")
        .is_some());
    for n in 0..5 {
        assert_eq!(
            envoy.post("/v1/completions", &completion(200 + n)).pod(),
            "pod-b"
        );
    }
    let seen = api.seen.lock().unwrap().clone();
    assert!(
        seen.iter()
            .any(|r| r.starts_with(&format!("GET {expected_path} HTTP/1.1"))
                && r.contains("Bearer test-token")),
        "{seen:?}"
    );
}
