//! Every shared-data key, built here and nowhere else. A pool's keys live under one namespace,
//! named by what its shared data means ([`crate::config::NamedPool::shared_identity`]): an
//! update that only re-tunes how endpoints are chosen keeps it, any other starts a fresh one so
//! old VMs' leases and ledgers do not interfere; so does a build that shares data in another
//! format.

/// The version of what VMs share (values and block hashes): a VM of another version uses
/// other keys.
const SHARED_FORMAT: u32 = 2;

/// One pool's keys in one configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedKeys {
    namespace: String,
}

impl SharedKeys {
    /// The keys of `pool` (named when the configuration lists several) of this shared
    /// identity.
    pub fn for_pool(identity: u64, pool: Option<&str>) -> Self {
        let base = format!("inference-picker/{SHARED_FORMAT}/{identity:x}");
        let namespace = match pool {
            Some(name) => format!("{base}/{name}"),
            None => base,
        };
        SharedKeys { namespace }
    }

    /// Keys under an explicit namespace (tests).
    pub fn under(namespace: &str) -> Self {
        SharedKeys {
            namespace: namespace.to_owned(),
        }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The scraper's lease.
    pub fn lease(&self) -> String {
        format!("{}/lease", self.namespace)
    }

    /// The scraper's snapshot of every endpoint's latest scrape.
    pub fn snapshot(&self) -> String {
        format!("{}/snapshot", self.namespace)
    }

    /// The VMs of this Envoy.
    pub fn vms(&self) -> String {
        format!("{}/vms", self.namespace)
    }

    /// The pool's members, as discovery found them.
    pub fn members(&self) -> String {
        format!("{}/members", self.namespace)
    }

    /// What each pod reported at its model list (`models-data-source`).
    pub fn models(&self) -> String {
        format!("{}/models", self.namespace)
    }

    /// VM `vm`'s in-flight counts.
    pub fn load(&self, vm: u64) -> String {
        format!("{}/load/{vm:x}", self.namespace)
    }

    /// VM `vm`'s prefix-index picks: one batch per slot, the slot its sequence modulo the
    /// batches kept.
    pub fn prefix(&self, vm: u64, slot: u64) -> String {
        format!("{}/prefix/{vm:x}/{slot}", self.namespace)
    }

    /// VM `vm`'s flow-control summary (what it holds).
    pub fn flow_summary(&self, vm: u64) -> String {
        format!("{}/flow/{vm:x}", self.namespace)
    }

    /// This replica's id among its peers.
    pub fn replica_origin(&self) -> String {
        format!("{}/replica/origin", self.namespace)
    }

    /// This replica's state, as its peers are served it.
    pub fn replica_state(&self) -> String {
        format!("{}/replica/state", self.namespace)
    }

    /// One of this replica's placement batches kept for its peers (`slot` of a ring).
    pub fn replica_batch(&self, slot: u64) -> String {
        format!("{}/replica/batch/{slot}", self.namespace)
    }

    /// Flow control's Envoy-wide ledger.
    pub fn flow_ledger(&self) -> String {
        format!("{}/flow-ledger", self.namespace)
    }
}
