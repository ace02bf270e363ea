//! The picker's per-request steps as a plain wasm module for `run.js` to time in Node's V8:
//! `setup(body_bytes)` builds the shipped picker and a body, `run(step, n)` runs a step `n`
//! times and returns how many requests it routed.

mod steps;

use std::cell::RefCell;

thread_local! {
    static STATE: RefCell<Option<(inference_picker_core::router::PoolRouter, steps::BenchHost)>> =
        const { RefCell::new(None) };
    static TICKS: RefCell<Option<steps::Ticks>> = const { RefCell::new(None) };
}

/// Runs `n` of the scraping VM's ticks (each scraping both pods); the scrapes answered.
#[no_mangle]
pub extern "C" fn tick(n: u32) -> u32 {
    TICKS.with(|ticks| {
        let mut ticks = ticks.borrow_mut();
        if ticks.is_none() {
            *ticks = steps::Ticks::new();
        }
        ticks.as_mut().map_or(0, |t| t.run(n as usize)) as u32
    })
}

/// 1 when the picker is configured and routes the body, 0 otherwise.
#[no_mangle]
pub extern "C" fn setup(body_bytes: u32) -> u32 {
    let Some(mut router) = steps::shipped_picker() else {
        return 0;
    };
    let body = steps::padded_completion(body_bytes as usize);
    let host = steps::BenchHost::new(&body);
    let routes = steps::run(&mut router, &host, steps::STEPS.len() - 1, 1) == 1;
    STATE.with(|state| *state.borrow_mut() = Some((router, host)));
    u32::from(routes)
}

#[no_mangle]
pub extern "C" fn run(step: u32, n: u32) -> u32 {
    STATE.with(|state| {
        let mut state = state.borrow_mut();
        let Some((router, host)) = state.as_mut() else {
            return 0;
        };
        steps::run(router, host, step as usize, n as usize) as u32
    })
}
