//! The requests this VM holds in one pool, and their way out: flow control's decision
//! ([`FlowControl`]) on each arrival, the parsed request kept while its stream waits, the
//! picks made for released requests until their streams take them back, and the refusals that
//! wait for a root callback to be sent.

use super::{Arrival, FlowControl, Pick};
use crate::datalayer::DataLayer;
use crate::director::{Director, Prepared, Routed};
use crate::error_response::RequestError;
use crate::host::SharedData;
use hashbrown::HashMap;

/// What flow control says about a request that is ready to be picked for.
#[derive(Debug, PartialEq)]
pub enum Admission {
    /// Pick now.
    Now(Box<Prepared>),
    /// Held: its stream stays paused until a [`Release`] names it.
    Held,
    /// Refused without waiting (the queue is full).
    Refused(RequestError),
}

/// A held request's way out of the queue, for the host edge to carry out.
#[derive(Debug, PartialEq)]
pub enum Release {
    /// Picked: write the decision into the held stream and resume it.
    Routed {
        id: u32,
        request_id: String,
        routed: Box<Routed>,
        body_size: usize,
        waited_ms: u64,
    },
    /// Refused (TTL, no endpoint after filters): answer the held stream with the error.
    Refused {
        id: u32,
        request_id: String,
        error: RequestError,
        waited_ms: u64,
    },
}

pub struct Queue {
    control: FlowControl,
    /// The requests held here, by stream id, with their request ids.
    held: HashMap<u32, (Prepared, String)>,
    /// Released requests whose streams have not yet taken their decision back.
    dispatched: HashMap<u32, Routed>,
    /// Refusals of held requests waiting for a root callback to send them.
    deferred: Vec<Release>,
    /// The slots the last gate check kept for higher bands (for the log).
    last_kept: u32,
}

impl Queue {
    pub fn new(control: FlowControl) -> Self {
        Queue {
            control,
            held: HashMap::new(),
            dispatched: HashMap::new(),
            deferred: Vec::new(),
            last_kept: 0,
        }
    }

    /// The slots the last gate check kept free for higher bands (`priority-reserve-policy`).
    pub fn last_kept(&self) -> u32 {
        self.last_kept
    }

    pub fn control(&self) -> &FlowControl {
        &self.control
    }

    pub fn control_mut(&mut self) -> &mut FlowControl {
        &mut self.control
    }

    /// Requests wait in this pool, here or (as last seen) in another VM, or refusals wait to
    /// be sent.
    pub fn waiting(&self, now_ms: u64) -> bool {
        !(self.control.idle(now_ms) && self.control.settled() && self.deferred.is_empty())
    }

    /// Reads what the other VMs hold.
    pub fn refresh(&mut self, store: &dyn SharedData) {
        if let Err(error) = self.control.refresh(store) {
            log::debug!("inference-picker: flow control: reading the other VMs' queues: {error}");
        }
    }

    /// Flow control's gate for a band: the pool's saturation is below the band's ceiling (the
    /// usage limit), and with `priority-reserve-policy` the band leaves the slots it keeps for
    /// higher bands. Also tells the queue whether the pool has an endpoint at all (which TTL
    /// applies).
    fn has_room(&mut self, director: &Director, data: &DataLayer, band: i32, now_ms: u64) -> bool {
        let saturation = director.pool_saturation(data, now_ms);
        self.control.set_has_endpoints(saturation.is_some(), now_ms);
        let Some(saturation) = saturation else {
            return false;
        };
        let ceiling = self.control.config().band(band).map_or(1.0, |b| b.ceiling);
        saturation < ceiling.min(self.reserve_ceiling(data, band, saturation, now_ms))
    }

    /// The saturation below which `band` leaves the slots it keeps for higher bands free: one
    /// request's share of the saturation is measured as the saturation over the requests in
    /// flight (whatever the detector counts), so `kept` slots are `kept` such shares, and the
    /// band may dispatch while fewer than the pool's slots minus `kept` are taken.
    fn reserve_ceiling(
        &mut self,
        data: &DataLayer,
        band: i32,
        saturation: f64,
        now_ms: u64,
    ) -> f64 {
        self.last_kept = 0;
        if self.control.config().reserve.is_none() || saturation <= 0.0 {
            return 1.0;
        }
        let in_flight: u32 = data
            .pool()
            .endpoints
            .iter()
            .filter(|endpoint| endpoint.routable(now_ms))
            .map(|endpoint| endpoint.total_in_flight())
            .sum();
        if in_flight == 0 {
            return 1.0;
        }
        let per_request = saturation / f64::from(in_flight);
        let kept = self
            .control
            .kept_for_higher(band, 1.0 / per_request, now_ms);
        self.last_kept = kept;
        if kept == 0 {
            return 1.0;
        }
        1.0 - (f64::from(kept) + 0.5) * per_request
    }

    /// Flow control's say on a parsed request: pick now (room in its band and nothing waiting
    /// in it or a higher band anywhere), hold it as `arrival.id`, or refuse it (queue full).
    pub fn admit(
        &mut self,
        (director, data): (&Director, &DataLayer),
        prepared: Prepared,
        arrival: Arrival,
        now_ms: u64,
        store: &dyn SharedData,
    ) -> Admission {
        let priority = arrival.priority;
        self.control.arrived(priority, now_ms);
        let room = self.has_room(director, data, priority, now_ms);
        if room && self.control.clear_for(priority, now_ms) {
            self.control.dispatched(now_ms);
            return Admission::Now(Box::new(prepared));
        }
        // Engaged: what the other VMs hold decides whether this one may pass them.
        self.refresh(store);
        if room && self.control.clear_for(priority, now_ms) {
            self.control.dispatched(now_ms);
            return Admission::Now(Box::new(prepared));
        }
        let (id, request_id) = (arrival.id, arrival.request_id.clone());
        match self.control.admit(arrival, now_ms, store) {
            Ok(()) => {
                self.held.insert(id, (prepared, request_id));
                Admission::Held
            }
            Err(dropped) => Admission::Refused(RequestError::Dropped(dropped)),
        }
    }

    /// Held requests that leave the queue now: those whose TTL ran out, then, while the pool
    /// has room, the next by priority, fairness and order (each picked for at once, so the
    /// next look at the room counts it).
    ///
    /// When the next request Envoy-wide is held by another VM, this VM serves its own best
    /// request of the same band instead (a free slot never idles for want of the right
    /// worker; the order across VMs bends a little, priority never); with nothing of that
    /// band here it leaves the slot to the other VM, which takes it on its next callback or
    /// tick.
    pub fn releases(
        &mut self,
        (director, data): (&mut Director, &mut DataLayer),
        now_ms: u64,
        store: &dyn SharedData,
        out: &mut Vec<Release>,
    ) {
        // Whether the pool has an endpoint decides which TTL applies.
        self.has_room(director, data, 0, now_ms);
        for (left, dropped) in self.control.expire(now_ms, store) {
            let request_id = self.held.remove(&left.id).map(|h| h.1).unwrap_or_default();
            out.push(Release::Refused {
                id: left.id,
                request_id,
                error: RequestError::Dropped(dropped),
                waited_ms: left.waited_ms,
            });
        }
        let bound = self.held.len() + 1;
        for _ in 0..bound {
            let Some((band, pick)) = self.control.pick(now_ms) else {
                return;
            };
            // The first band over its ceiling stops the round: lower bands never pass it.
            if !self.has_room(director, data, band, now_ms) {
                return;
            }
            let id = match pick {
                Pick::Local(id) => id,
                Pick::Remote(_) => match self.control.pick_local(band, now_ms) {
                    Some(id) => id,
                    None => return,
                },
            };
            let Some(left) = self.control.dispatch(id, now_ms, store) else {
                return;
            };
            let Some((prepared, request_id)) = self.held.remove(&left.id) else {
                continue;
            };
            let body_size = prepared.body_size;
            self.control.dispatched(now_ms);
            out.push(match director.route_prepared(data, prepared) {
                Ok(routed) => Release::Routed {
                    id: left.id,
                    request_id,
                    routed: Box::new(routed),
                    body_size,
                    waited_ms: left.waited_ms,
                },
                Err(error) => Release::Refused {
                    id: left.id,
                    request_id,
                    error,
                    waited_ms: left.waited_ms,
                },
            });
        }
    }

    /// A held request's client went away: it leaves the queue; returns how long it waited.
    pub fn abandon(&mut self, id: u32, now_ms: u64, store: &dyn SharedData) -> Option<u64> {
        self.held.remove(&id);
        let left = self.control.remove(id, now_ms, store)?;
        Some(left.waited_ms)
    }

    /// A refusal to send from the next root callback.
    pub fn defer(&mut self, release: Release) {
        self.deferred.push(release);
    }

    pub fn has_deferred(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// The refusals deferred so far, to send now.
    pub fn take_deferred(&mut self, out: &mut Vec<Release>) {
        out.append(&mut self.deferred);
    }

    /// The host edge resumed a released request; its stream takes the decision back later.
    pub fn record_dispatched(&mut self, id: u32, routed: Routed) {
        self.dispatched.insert(id, routed);
    }

    pub fn take_dispatched(&mut self, id: u32) -> Option<Routed> {
        self.dispatched.remove(&id)
    }
}
