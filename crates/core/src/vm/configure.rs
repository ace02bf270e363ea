//! Loading a configuration into one VM: every pool's rooms (data layer, director, queue) in the
//! router, each pool's tick driver with its shared-data keys, and the tick period.

use crate::config;
use crate::duration::duration_ms;
use crate::peers::Peers;
use crate::router::{stats_prefix, PoolRouter, PoolSlot};
use crate::shared_keys::SharedKeys;
use crate::shared_state::Coordinator;
use crate::tick_driver::TickDriver;

/// One VM's configuration, loaded: every pool (in the router) and its tick driver, in the same
/// order, and the tick period.
pub struct Configured {
    pub router: PoolRouter,
    pub ticks: Vec<PoolTicks>,
    pub tick_ms: u32,
}

/// One pool's timer side: its tick driver, the prefix of its stats, and how often it ticks.
pub struct PoolTicks {
    pub driver: TickDriver,
    pub stats_prefix: String,
    pub interval_ms: u64,
}

/// Loads the plugin configuration for one VM; `vm_seed` must differ between VMs, or every
/// worker breaks ties alike. Warnings go to the log; the error says what to fix.
pub fn configure(text: &[u8], vm_seed: u64) -> Result<Configured, String> {
    let text = std::str::from_utf8(text)
        .map_err(|_| "invalid configuration: it is not UTF-8 text".to_owned())?;
    let set = config::load_set(text, vm_seed, false).map_err(|error| error.to_string())?;
    let many = set.listed;
    let mut slots = Vec::with_capacity(set.pools.len());
    let mut ticks = Vec::with_capacity(set.pools.len());
    for pool in set.pools {
        for warning in &pool.config.warnings {
            log::warn!("inference-picker: pool {}: {warning}", pool.name);
        }
        let interval_ms = duration_ms(pool.config.pool.refresh_metrics_interval);
        // Each pool elects its own scraper and keeps its own shared state.
        let keys = SharedKeys::for_pool(pool.shared_identity, many.then_some(pool.name.as_str()));
        let coordinator = Coordinator::new(keys.clone(), vm_seed, interval_ms);
        let models = pool.router_models();
        let peers = pool.config.pool.peers.clone().map(Peers::new);
        ticks.push(PoolTicks {
            driver: TickDriver::new(Some(coordinator), peers),
            stats_prefix: stats_prefix(many.then_some(pool.name.as_str())),
            interval_ms,
        });
        let mut slot = PoolSlot::new(pool.name, pool.config);
        if slot.data.settings().peers.is_some() {
            slot.peer_keys = Some(keys.clone());
        }
        if let Some(queue) = &mut slot.queue {
            queue.control_mut().attach(keys, vm_seed);
        }
        slots.push((slot, models));
    }
    let tick_ms = ticks.iter().map(|t| t.interval_ms).min().unwrap_or(1000);
    Ok(Configured {
        router: PoolRouter::new(slots, set.pool_header),
        ticks,
        tick_ms: u32::try_from(tick_ms).unwrap_or(u32::MAX),
    })
}
