//! Flow control on the host: when held requests are let out, how each release is carried out
//! on its own stream, and how fast the VM ticks while requests wait anywhere in the Envoy.

use crate::error_response::RequestError;
use crate::flow_control::queue::Release;
use crate::host::{HttpHost, VmHost};
use crate::request::ApiKind;
use crate::request_driver::{write_decision, ClientSent};
use crate::router::PoolSlot;
use crate::stats::{QueueExit, Stats};

/// The tick period while requests wait: another VM's freed slot (seen in its in-flight
/// counts) reaches this VM's held requests within this long.
pub const FLOW_TICK_MS: u32 = 5;

/// Whether the VM ticks every [`FLOW_TICK_MS`] rather than at its configured period
/// (`tick_ms`): requests wait in some pool, here or (as last seen) in another VM.
pub fn ticks_fast(pools: &[PoolSlot], now_ms: u64, tick_ms: u32) -> bool {
    FLOW_TICK_MS < tick_ms && pools.iter().any(|pool| pool.flow_waiting(now_ms))
}

/// Which kind of callback flow control acts from: only a root context's (a tick, a callout
/// answer) may send local replies to held streams.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Callback {
    Root,
    Stream,
}

/// Flow control's part of a callback: lets out what may go (resuming or answering this VM's
/// held streams, each by its id) and publishes what this VM holds. Only a clock read while
/// nothing waits anywhere.
pub fn release_held<H: VmHost>(
    host: &H,
    slot: &mut PoolSlot,
    stats: Option<&Stats<H>>,
    callback: Callback,
) {
    let root = callback == Callback::Root;
    let PoolSlot {
        data,
        director,
        queue,
        ..
    } = slot;
    let Some(queue) = queue else {
        return;
    };
    let now_ms = host.now_ms().unwrap_or(0);
    let quiet = queue.control().idle(now_ms) && queue.control().settled();
    if quiet && !(root && queue.has_deferred()) {
        return;
    }
    let mut releases = Vec::new();
    if root {
        queue.take_deferred(&mut releases);
    }
    queue.releases((director, data), now_ms, host, &mut releases);
    for release in releases {
        carry_out_on_stream(host, slot, stats, release, root);
    }
    if let Some(queue) = &mut slot.queue {
        if let Err(error) = queue.control_mut().publish(host, now_ms) {
            log::debug!("inference-picker: flow control: publishing this VM's queue: {error}");
        }
    }
    if let Some(stats) = stats {
        stats.flow_gauges(slot, now_ms);
    }
}

/// Resumes (or answers) one released request on its own stream.
fn carry_out_on_stream<H: VmHost>(
    host: &H,
    slot: &mut PoolSlot,
    stats: Option<&Stats<H>>,
    release: Release,
    may_answer: bool,
) {
    let (id, exit, waited_ms) = match &release {
        Release::Routed {
            id,
            waited_ms,
            routed,
            ..
        } => (
            *id,
            QueueExit::Dispatched {
                primary: routed.primary,
            },
            *waited_ms,
        ),
        Release::Refused {
            id,
            error,
            waited_ms,
            ..
        } => (*id, QueueExit::Refused(error.clone()), *waited_ms),
    };
    let Some(stream) = host.stream(id) else {
        // The stream is gone (its end already ran): give back what the pick took.
        if let Release::Routed { routed, .. } = &release {
            slot.director.request_ended(&mut slot.data, routed);
        }
        return;
    };
    let exit = match carry_out(&stream, slot, release, may_answer) {
        Carried::Resume => match host.resume(id) {
            Ok(()) => exit,
            Err(error) => {
                log::warn!("inference-picker: resuming a released request: {error}");
                return;
            }
        },
        Carried::Answered => match exit {
            QueueExit::Dispatched { .. } => QueueExit::Refused(RequestError::NoEndpoint(
                "the destination could not be set".into(),
            )),
            refused => refused,
        },
        Carried::Deferred(refusal) => {
            if let Some(queue) = &mut slot.queue {
                queue.defer(refusal);
            }
            return;
        }
    };
    if let Some(stats) = stats {
        stats.flow_left(exit, waited_ms);
    }
}

/// What became of a released request on its stream.
#[derive(Debug, PartialEq)]
pub enum Carried {
    /// The decision is written: resume the stream.
    Resume,
    /// The stream was answered with its refusal.
    Answered,
    /// A refusal that must wait for a root callback (see [`carry_out`]).
    Deferred(Release),
}

/// Carries out flow control's release of a held request on its stream (the host is that
/// stream's): writes the decision, or answers with the refusal. A local reply sent from
/// another stream's callback would change how Envoy treats that stream's own return
/// (it stops buffering its body), so with `may_answer` false a refusal is handed back to be
/// sent from a root callback (a tick or a callout answer, within a few ms).
pub fn carry_out(
    host: &impl HttpHost,
    slot: &mut PoolSlot,
    release: Release,
    may_answer: bool,
) -> Carried {
    let refusal = match release {
        Release::Routed {
            id,
            routed,
            body_size,
            waited_ms,
            request_id,
        } => {
            // A held stream's request state is not at hand here: remove what a client could
            // have sent.
            if let Err(error) = write_decision(host, &routed, body_size, ClientSent::default()) {
                log::error!("inference-picker: applying a released decision: {error}");
                slot.director.request_ended(&mut slot.data, &routed);
                Release::Refused {
                    id,
                    request_id,
                    error: RequestError::NoEndpoint("the destination could not be set".into()),
                    waited_ms,
                }
            } else {
                log::debug!(
                    "inference-picker: flow control released request_id={request_id} waited_ms={waited_ms} reason=dispatched picked={} priority={} {}",
                    routed.destination,
                    routed.priority,
                    slot.director.explain_last(&slot.data)
                );
                if let Some(queue) = &mut slot.queue {
                    queue.record_dispatched(id, *routed);
                }
                return Carried::Resume;
            }
        }
        refused @ Release::Refused { .. } => refused,
    };
    if !may_answer {
        return Carried::Deferred(refusal);
    }
    if let Release::Refused {
        error,
        waited_ms,
        request_id,
        ..
    } = &refusal
    {
        log::debug!(
            "inference-picker: flow control refused request_id={request_id} waited_ms={waited_ms} reason={} {error}",
            error.dropped_reason().unwrap_or("no-endpoint")
        );
        // The held stream's own path: flow control keeps no API kind for what it holds.
        let path = host.request_header(":path").unwrap_or_default();
        if let Err(host_error) = host.send_error(error, ApiKind::from_path(&path).error_shape()) {
            log::error!(
                "inference-picker: sending the {} reply: {host_error}",
                error.status()
            );
        }
    }
    Carried::Answered
}
