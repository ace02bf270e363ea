//! The dynamic module's own checks. The integration suite runs against it as against the wasm
//! filter (`INFERENCE_PICKER_EDGE=module`, `make integration`); these hold its config to the
//! shipped one, its load to the Envoy it is built for, and a panic to the request it costs.

mod support;

use support::{
    completion, module_dir, repo, shipped_picker_config, to_module_edge, with_endpoints, Envoy,
    EnvoyConfig, Sim,
};

/// A panic inside the picker (a bug; the code denies what panics) costs the request it
/// happened in: that client gets a 503, Envoy's process carries on with every other request,
/// and the `panics` counter and Envoy's log say so. Made to happen with the module built with
/// its `fault-injection` feature (`make fault-module`): a request carrying
/// `x-inference-picker-fault: panic` panics; the shipped artefact has no such switch.
#[test]
fn a_panic_in_the_module_costs_one_request_not_envoy() {
    let faults = repo().join("target/faults/release-module");
    assert!(
        faults.join("libinference_picker_module.so").exists(),
        "run `make fault-module` (make test does it)"
    );
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &[]);
    let envoy = Envoy::start_module_from(
        &faults,
        &with_endpoints(&shipped_picker_config(), &[&a, &b]),
        2,
    );
    envoy.wait_for_fresh_endpoints(2);
    let panicking = envoy.post_with(
        "/v1/completions",
        &[
            ("content-type", "application/json"),
            ("x-inference-picker-fault", "panic"),
        ],
        &completion(0),
    );
    assert_eq!(panicking.status, 503, "{}", panicking.text());
    // Every later request, on either worker, is routed as before.
    for n in 1..=8 {
        let response = envoy.post("/v1/completions", &completion(n));
        assert_eq!(response.status, 200, "{}", response.text());
        assert!(["pod-a", "pod-b"].contains(&response.pod().as_str()));
    }
    assert_eq!(envoy.stat("wasmcustom.inference_picker.panics"), Some(1.0));
    let log = envoy.log();
    assert!(
        log.contains("Envoy carries on") && log.contains("fault injection"),
        "{log}"
    );
}

#[test]
fn the_module_config_is_the_shipped_one_with_the_filter_swapped() {
    let mut converted = EnvoyConfig::load("envoy/envoy.yaml");
    to_module_edge(&mut converted);
    let module = EnvoyConfig::load("envoy/envoy-module.yaml");
    assert_eq!(
        converted, module,
        "envoy/envoy-module.yaml must be envoy/envoy.yaml with only the picker's filter swapped \
         (tests/support/edge.rs makes the same swap for every test config)"
    );
    // The swap is real: the module's filter, no header_to_metadata, metadata for the host.
    let filters = module.http_filters();
    assert!(filters
        .iter()
        .any(|f| f["name"] == "envoy.filters.http.dynamic_modules"));
    assert!(!filters
        .iter()
        .any(|f| f["name"] == "envoy.filters.http.wasm"));
    assert!(!filters
        .iter()
        .any(|f| f["name"] == "envoy.filters.http.header_to_metadata"));
    let source = &module.cluster("inference_pool")["load_balancing_policy"]["policies"][0]
        ["typed_extension_config"]["typed_config"]["override_host_sources"][0];
    assert_eq!(source["metadata"]["key"], "envoy.lb");
}

/// Outside an Envoy that exports every callback it uses, the module refuses to load (its
/// init returns null, which Envoy reports as a failed load) rather than crash at a first call.
#[test]
fn the_module_refuses_a_process_without_its_envoy_callbacks() {
    let path = module_dir().join("libinference_picker_module.so");
    let path = std::ffi::CString::new(path.display().to_string()).unwrap();
    // SAFETY: dlopen/dlsym of our own module; the init function takes no arguments.
    unsafe {
        let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!handle.is_null(), "the module loads as a shared library");
        let init = libc::dlsym(handle, c"envoy_dynamic_module_on_program_init".as_ptr());
        assert!(!init.is_null(), "the module exports its init hook");
        let init: extern "C" fn() -> *const std::ffi::c_char = std::mem::transmute(init);
        assert!(
            init().is_null(),
            "without Envoy's callbacks the module must refuse to initialise"
        );
        libc::dlclose(handle);
    }
    assert!(repo().join("envoy/envoy-module.yaml").exists());
}
