//! The picker's side of Envoy in a native module: the core's host traits over the ABI's
//! callbacks. One [`NativeHost`] per filter config: its callouts and stats go through that
//! config, its timer is [`Ticker`], its shared data is this process's memory, and its streams
//! are [`NativeStream`]s.

use crate::abi::{self, envoy, EnvoyPtr, ModuleBuffer, ModuleHeader};
use crate::stream::{NativeStream, Streams};
use crate::support::{count, failed, lock, shared, take_counts, wall_clock_ns};
use crate::ticker::Ticker;
use inference_picker_core::host::{
    Clock, HostCall, HostError, HttpCallouts, MetricKind, Metrics, SharedData, VmHost,
};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

/// What one filter config's host knows.
pub struct HostState {
    /// Envoy's filter config: callouts and stats go through it.
    pub config: EnvoyPtr,
    /// The thread Envoy configured the filter on, its main thread: config callouts must start
    /// there.
    pub main_thread: ThreadId,
    pub ticker: Arc<Ticker>,
    /// The stream whose hook runs and the streams flow control holds.
    pub streams: Arc<Mutex<Streams>>,
    /// Our stat ids are indices here.
    stats: Mutex<Vec<Stat>>,
    /// The endpoint stats' families (`{prefix}.endpoint.{what}`, labeled `endpoint`): Envoy's
    /// ids, by name. Defined while the configuration loads; endpoints label them later.
    families: Mutex<Vec<(String, usize)>>,
}

/// One stat as the core knows it: its kind, Envoy's id, and for an endpoint's stat the
/// `endpoint` label of the family that id names.
#[derive(Clone)]
struct Stat {
    kind: MetricKind,
    envoy_id: usize,
    endpoint: Option<Arc<str>>,
}

/// The label of every endpoint stat family, as the wasm filter's `stats_tags` rules name it.
const ENDPOINT_LABEL: &str = "endpoint";

#[derive(Clone)]
pub struct NativeHost {
    pub state: Arc<HostState>,
}

impl NativeHost {
    pub fn new(config: EnvoyPtr, ticker: Arc<Ticker>) -> NativeHost {
        NativeHost {
            state: Arc::new(HostState {
                config,
                main_thread: std::thread::current().id(),
                ticker,
                streams: Arc::default(),
                stats: Mutex::new(Vec::new()),
                families: Mutex::new(Vec::new()),
            }),
        }
    }

    fn stat(&self, id: u32) -> Option<Stat> {
        let index = usize::try_from(id).ok()?;
        lock(&self.state.stats).get(index).cloned()
    }

    /// Envoy's id for stat `name` with these labels, defined now (Envoy refuses once the
    /// configuration has loaded).
    fn define_in_envoy(
        &self,
        kind: MetricKind,
        name: &str,
        labels: &[&str],
    ) -> Result<usize, HostError> {
        const CALL: &str = "http_filter_config_define_stat";
        count(HostCall::Metric);
        let envoy = envoy().ok_or(failed(CALL))?;
        let define = match kind {
            MetricKind::Counter => envoy.http_filter_config_define_counter,
            MetricKind::Gauge => envoy.http_filter_config_define_gauge,
            MetricKind::Histogram => envoy.http_filter_config_define_histogram,
        };
        let mut labels: Vec<ModuleBuffer> = labels
            .iter()
            .map(|label| ModuleBuffer::of(label.as_bytes()))
            .collect();
        let mut envoy_id = 0usize;
        // SAFETY: Envoy's config pointer; the name and labels are read during the call.
        let result = unsafe {
            define(
                self.state.config.0,
                ModuleBuffer::of(name.as_bytes()),
                labels.as_mut_ptr(),
                labels.len(),
                &mut envoy_id,
            )
        };
        if result == abi::METRICS_SUCCESS {
            Ok(envoy_id)
        } else {
            Err(HostError {
                call: CALL,
                status: result,
            })
        }
    }

    /// Envoy's id for the endpoint family `name`, defined on first use.
    fn family(&self, kind: MetricKind, name: &str) -> Result<usize, HostError> {
        let mut families = lock(&self.state.families);
        if let Some((_, id)) = families.iter().find(|(family, _)| family == name) {
            return Ok(*id);
        }
        let id = self.define_in_envoy(kind, name, &[ENDPOINT_LABEL])?;
        families.push((name.to_owned(), id));
        Ok(id)
    }

    fn push(&self, stat: Stat) -> Result<u32, HostError> {
        let mut stats = lock(&self.state.stats);
        stats.push(stat);
        u32::try_from(stats.len() - 1).map_err(|_| failed("http_filter_config_define_stat"))
    }
}

impl SharedData for NativeHost {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        count(HostCall::SharedData);
        shared().get(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<bool, HostError> {
        count(HostCall::SharedData);
        shared().set(key, value, cas)
    }
}

impl HttpCallouts for NativeHost {
    /// Config callouts run on Envoy's main thread (ticks and callout answers arrive there).
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u32,
    ) -> Result<u32, HostError> {
        const CALL: &str = "http_filter_config_http_callout";
        count(HostCall::HttpCall);
        if std::thread::current().id() != self.state.main_thread {
            return Err(failed(CALL));
        }
        let envoy = envoy().ok_or(failed(CALL))?;
        let mut headers: Vec<ModuleHeader> = headers
            .iter()
            .map(|(name, value)| ModuleHeader::of(name, value))
            .collect();
        let mut id = 0u64;
        // SAFETY: the config pointer is Envoy's, alive while this config is; the headers and
        // cluster name are read during the call only.
        let result = unsafe {
            (envoy.http_filter_config_http_callout)(
                self.state.config.0,
                &mut id,
                ModuleBuffer::of(cluster.as_bytes()),
                headers.as_mut_ptr(),
                headers.len(),
                ModuleBuffer::NULL,
                u64::from(timeout_ms),
            )
        };
        if result != abi::CALLOUT_INIT_SUCCESS {
            return Err(HostError {
                call: CALL,
                status: result,
            });
        }
        u32::try_from(id).map_err(|_| failed(CALL))
    }
}

impl Metrics for NativeHost {
    /// Stats are defined while Envoy loads the config; Envoy freezes them after (a later
    /// definition fails, and the core goes without that stat).
    fn define(&self, kind: MetricKind, name: &str) -> Result<u32, HostError> {
        let envoy_id = self.define_in_envoy(kind, name, &[])?;
        self.push(Stat {
            kind,
            envoy_id,
            endpoint: None,
        })
    }

    /// The family `{prefix}.endpoint.{what}` labeled with `address`: in `/stats/prometheus`
    /// the same series as the wasm filter's, for listed and discovered endpoints alike.
    fn define_endpoint(
        &self,
        kind: MetricKind,
        prefix: &str,
        what: &str,
        address: &str,
    ) -> Result<u32, HostError> {
        let envoy_id = self.family(kind, &format!("{prefix}.endpoint.{what}"))?;
        let id = self.push(Stat {
            kind,
            envoy_id,
            endpoint: Some(address.into()),
        })?;
        // Envoy makes a labeled stat on its first update: at 0 now, as a named one is.
        self.increment(id, 0)?;
        Ok(id)
    }

    fn define_endpoint_family(
        &self,
        kind: MetricKind,
        prefix: &str,
        what: &str,
    ) -> Result<(), HostError> {
        self.family(kind, &format!("{prefix}.endpoint.{what}"))
            .map(|_| ())
    }

    fn increment(&self, id: u32, offset: i64) -> Result<(), HostError> {
        const CALL: &str = "http_filter_config_increment_stat";
        count(HostCall::Metric);
        let envoy = envoy().ok_or(failed(CALL))?;
        let stat = self.stat(id).ok_or(failed(CALL))?;
        let update = match (stat.kind, offset >= 0) {
            (MetricKind::Counter, true) => envoy.http_filter_config_increment_counter,
            (MetricKind::Gauge, true) => envoy.http_filter_config_increment_gauge,
            (MetricKind::Gauge, false) => envoy.http_filter_config_decrement_gauge,
            _ => return Err(failed(CALL)),
        };
        self.update_stat(CALL, update, &stat, offset.unsigned_abs())
    }

    fn record(&self, id: u32, value: u64) -> Result<(), HostError> {
        const CALL: &str = "http_filter_config_record_stat";
        count(HostCall::Metric);
        let envoy = envoy().ok_or(failed(CALL))?;
        let stat = self.stat(id).ok_or(failed(CALL))?;
        let update = match stat.kind {
            MetricKind::Gauge => envoy.http_filter_config_set_gauge,
            MetricKind::Histogram => envoy.http_filter_config_record_histogram_value,
            MetricKind::Counter => return Err(failed(CALL)),
        };
        self.update_stat(CALL, update, &stat, value)
    }
}

type StatUpdate =
    unsafe extern "C" fn(*mut std::ffi::c_void, usize, *mut ModuleBuffer, usize, u64) -> u32;

impl NativeHost {
    fn update_stat(
        &self,
        call: &'static str,
        update: StatUpdate,
        stat: &Stat,
        value: u64,
    ) -> Result<(), HostError> {
        let mut label = stat
            .endpoint
            .as_deref()
            .map(|address| ModuleBuffer::of(address.as_bytes()));
        let (labels, count) = match label.as_mut() {
            Some(label) => (label as *mut ModuleBuffer, 1),
            None => (std::ptr::null_mut(), 0),
        };
        // SAFETY: Envoy's config pointer and a stat Envoy defined on it, with its family's one
        // label when it has one (read during the call). Stats are thread-safe in Envoy, so any
        // thread may update them.
        let result = unsafe { update(self.state.config.0, stat.envoy_id, labels, count, value) };
        if result == abi::METRICS_SUCCESS {
            Ok(())
        } else {
            Err(HostError {
                call,
                status: result,
            })
        }
    }
}

impl Clock for NativeHost {
    fn now_ms(&self) -> Result<u64, HostError> {
        self.now_ns().map(|nanos| nanos / 1_000_000)
    }
}

impl VmHost for NativeHost {
    type Stream = NativeStream;

    /// The running hook's own stream directly; a held one through its worker.
    fn stream(&self, id: u32) -> Option<NativeStream> {
        Streams::reach(&self.state.streams, id)
    }

    fn resume(&self, id: u32) -> Result<(), HostError> {
        count(HostCall::Stream);
        lock(&self.state.streams).resume(id)
    }

    fn set_tick_period_ms(&self, period_ms: u32) -> Result<(), HostError> {
        self.state.ticker.set_period_ms(period_ms);
        Ok(())
    }

    /// The wall clock, as proxy-wasm's clock call reads it.
    fn now_ns(&self) -> Result<u64, HostError> {
        wall_clock_ns()
    }

    /// What the module holds on the heap now (it shares Envoy's; [`crate::memory`] counts
    /// its own allocations).
    fn memory_bytes(&self) -> u64 {
        crate::memory::live_bytes()
    }

    fn take_host_calls(&self) -> [u64; HostCall::ALL.len()] {
        take_counts()
    }

    fn sync_log_level(&self) {
        crate::logging::sync_level();
    }
}
