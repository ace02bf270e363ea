//! The picker's timer. The dynamic-module ABI gives a filter config no periodic timer, only a
//! scheduler that runs an event on Envoy's main thread: this thread commits a tick event there
//! at the period the core asks for, as proxy-wasm's tick would fire.

use crate::abi::{envoy, EnvoyPtr};
use crate::support::lock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The event the config's scheduler fires for a tick.
pub const TICK: u64 = 1;

struct Timing {
    /// 0: no tick (as a proxy-wasm tick period of 0).
    period_ms: u32,
    /// The config's scheduler; `None` once the config is gone, which ends the thread.
    scheduler: Option<EnvoyPtr>,
}

pub struct Ticker {
    timing: Mutex<Timing>,
    changed: Condvar,
    /// A tick was committed and has not run yet: a busy main thread gets no backlog of them.
    pending: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Ticker {
    pub fn new() -> Arc<Ticker> {
        Arc::new(Ticker {
            timing: Mutex::new(Timing {
                period_ms: 0,
                scheduler: None,
            }),
            changed: Condvar::new(),
            pending: AtomicBool::new(false),
            thread: Mutex::new(None),
        })
    }

    /// The committed tick is running: the next may be committed.
    pub fn ticked(&self) {
        self.pending.store(false, Ordering::Release);
    }

    /// Takes effect at once, as proxy-wasm's tick period does.
    pub fn set_period_ms(&self, period_ms: u32) {
        lock(&self.timing).period_ms = period_ms;
        self.changed.notify_all();
    }

    /// Starts ticking through `scheduler` (the config's, made on the main thread); on failure
    /// the scheduler is deleted.
    pub fn start(self: &Arc<Self>, scheduler: EnvoyPtr) -> std::io::Result<()> {
        lock(&self.timing).scheduler = Some(scheduler);
        let ticker = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("inference-picker-tick".into())
            .spawn(move || ticker.run());
        match spawned {
            Ok(thread) => {
                *lock(&self.thread) = Some(thread);
                Ok(())
            }
            Err(error) => {
                self.stop();
                Err(error)
            }
        }
    }

    /// Stops the thread, waits for it, and deletes the scheduler: no tick is committed and no
    /// code of the module runs on that thread after this returns.
    pub fn stop(&self) {
        let scheduler = lock(&self.timing).scheduler.take();
        self.changed.notify_all();
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
        if let (Some(scheduler), Some(envoy)) = (scheduler, envoy()) {
            // SAFETY: the scheduler this ticker was started with, deleted once.
            unsafe { (envoy.http_filter_config_scheduler_delete)(scheduler.0) };
        }
    }

    fn run(&self) {
        let mut next = Instant::now();
        let mut timing = lock(&self.timing);
        loop {
            let Some(scheduler) = timing.scheduler else {
                return;
            };
            let now = Instant::now();
            if timing.period_ms > 0 && now >= next {
                // While the last tick waits for the main thread, this one is skipped.
                let idle = !self.pending.swap(true, Ordering::AcqRel);
                if let (true, Some(envoy)) = (idle, envoy()) {
                    // SAFETY: the scheduler is alive while it is in `timing` (stop takes it
                    // under this lock before deleting it); commit may come from any thread.
                    unsafe { (envoy.http_filter_config_scheduler_commit)(scheduler.0, TICK) };
                }
                next = now + Duration::from_millis(u64::from(timing.period_ms));
            }
            let wait = match timing.period_ms {
                0 => Duration::from_secs(3600),
                period => next
                    .saturating_duration_since(now)
                    .min(Duration::from_millis(u64::from(period))),
            };
            timing = self
                .changed
                .wait_timeout(timing, wait)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
            // A shorter period applies from now, not after the longer wait.
            let period = Duration::from_millis(u64::from(timing.period_ms));
            if next > Instant::now() + period {
                next = Instant::now() + period;
            }
        }
    }
}
