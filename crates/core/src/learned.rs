//! What one VM learned from the requests it placed, behind one interface, so that whatever
//! shares it (the VMs of one Envoy through shared data today; Envoy replicas later) reads it and
//! merges what others learned the same way: its requests in flight per endpoint, and the prefix
//! placements it made. What arrives from elsewhere never overwrites this VM's own observations:
//! others' in-flight counts are kept beside its own, others' placements enter the prefix index
//! as remote. (Latency fits come from scrapes: the data layer's snapshot carries them.)

use crate::scheduling::LearnedPrefix;

/// One endpoint's requests in flight and their tokens, as one VM counts them.
pub type InFlight = (u32, u64);

pub trait Learned {
    /// This VM's own in-flight counts, in endpoint order.
    fn own_in_flight(&self, out: &mut Vec<InFlight>);
    /// The other VMs' in-flight counts, summed per endpoint (index order).
    fn merge_in_flight(&mut self, others: &[InFlight]);
    /// The prefix placements made here since the last call.
    fn take_placements(&mut self, out: &mut Vec<LearnedPrefix>);
    /// A placement another VM made.
    fn merge_placement(&mut self, placement: &LearnedPrefix);
    /// Endpoints, in the order the counts are listed.
    fn endpoints(&self) -> usize;
    /// Requests this VM placed since it started.
    fn placed(&self) -> u64;
    /// Another VM placed requests on this pool since the last exchange.
    fn note_use(&mut self);
}
