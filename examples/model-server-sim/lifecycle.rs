//! A pod's life at the socket: the listening socket it can close and open again (a pod that
//! refuses new connections while it keeps serving the ones it has: `POST /admin/fault`
//! `{"mode":"refuse"}`), and the graceful stop on SIGTERM: stop accepting, finish the requests
//! in flight (their responses say `connection: close`), close idle keep-alive connections, exit
//! once every connection is gone (or after `--drain-timeout-s`).

use crate::http1::{self, Request};
use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DoorState {
    /// Accepting connections.
    Open,
    /// Not listening: new connections are refused, open ones are served.
    Closed,
    /// Stopping for good: no new connections, open ones close after their request.
    Draining,
}

struct State {
    door: DoorState,
    /// The accept loop holds a bound listening socket.
    listening: bool,
}

/// One open connection: a handle to shut it down, and whether a request is being answered.
struct Connection {
    stream: Arc<TcpStream>,
    busy: bool,
}

/// The pause after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// One pod's listening socket and open connections.
pub struct Door {
    address: SocketAddr,
    state: Mutex<State>,
    changed: Condvar,
    connections: Mutex<HashMap<u64, Connection>>,
    next_connection: AtomicU64,
    draining: AtomicBool,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Door {
    pub fn new(address: SocketAddr) -> Arc<Door> {
        Arc::new(Door {
            address,
            state: Mutex::new(State {
                door: DoorState::Open,
                listening: true,
            }),
            changed: Condvar::new(),
            connections: Mutex::new(HashMap::new()),
            next_connection: AtomicU64::new(0),
            draining: AtomicBool::new(false),
        })
    }

    /// Stopping: responses should tell the client that the connection closes after them.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Accepts connections and serves each on its own thread with `handle`, while the door is
    /// open; closed, it drops the listening socket and binds the same address again when it
    /// opens. Returns when the pod drains.
    pub fn run(
        self: &Arc<Door>,
        listener: TcpListener,
        handle: impl Fn(&Request, &mut TcpStream) -> bool + Send + Sync + 'static,
    ) {
        let handle = Arc::new(handle);
        let mut listener = Some(listener);
        loop {
            let Some(open) = listener.take() else {
                match self.wait_until_not_closed() {
                    DoorState::Draining => return,
                    _ => {
                        listener = self.bind_again();
                        continue;
                    }
                }
            };
            for stream in open.incoming() {
                let Ok(stream) = stream else {
                    // Out of descriptors or memory: accept fails at once until some close,
                    // and retrying without a pause would spin on a core.
                    thread::sleep(ACCEPT_BACKOFF);
                    continue;
                };
                if locked(&self.state).door != DoorState::Open {
                    // Possibly the wake-up connection of `close`; either way, not served.
                    drop(stream);
                    break;
                }
                let (door, handle) = (Arc::clone(self), Arc::clone(&handle));
                thread::spawn(move || door.serve(stream, &*handle));
            }
            drop(open);
            let mut state = locked(&self.state);
            state.listening = false;
            self.changed.notify_all();
        }
    }

    /// Blocks while the door is closed; the state that ended the wait.
    fn wait_until_not_closed(&self) -> DoorState {
        let mut state = locked(&self.state);
        while state.door == DoorState::Closed {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        state.door
    }

    /// The same address again (the kernel may take a moment to let it go).
    fn bind_again(&self) -> Option<TcpListener> {
        loop {
            if locked(&self.state).door != DoorState::Open {
                return None;
            }
            match TcpListener::bind(self.address) {
                Ok(listener) => {
                    let mut state = locked(&self.state);
                    state.listening = true;
                    self.changed.notify_all();
                    return Some(listener);
                }
                Err(_) => thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Stops listening (new connections are refused) and keeps serving open connections; with
    /// `reopen_after`, opens again by itself. Returns once the socket is closed.
    pub fn close(self: &Arc<Door>, reopen_after: Option<Duration>) {
        {
            let mut state = locked(&self.state);
            if state.door != DoorState::Open {
                return;
            }
            state.door = DoorState::Closed;
        }
        self.wait_not_listening();
        if let Some(after) = reopen_after {
            let door = Arc::clone(self);
            thread::spawn(move || {
                thread::sleep(after);
                door.open();
            });
        }
    }

    /// Listens again after `close`; returns once the socket is bound (or after a second).
    pub fn open(&self) {
        let mut state = locked(&self.state);
        if state.door != DoorState::Closed {
            return;
        }
        state.door = DoorState::Open;
        self.changed.notify_all();
        let deadline = Instant::now() + Duration::from_secs(1);
        while !state.listening && Instant::now() < deadline {
            state = self
                .changed
                .wait_timeout(state, Duration::from_millis(10))
                .map(|(state, _)| state)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
        }
    }

    /// Wakes the accept loop (blocked in accept) until it has dropped its socket.
    fn wait_not_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            if !locked(&self.state).listening || Instant::now() > deadline {
                return;
            }
            let _ = TcpStream::connect_timeout(&self.address, Duration::from_millis(100));
            thread::sleep(Duration::from_millis(2));
        }
    }

    /// The graceful stop: no new connections; idle ones are closed now, busy ones after
    /// their response.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
        {
            let mut state = locked(&self.state);
            state.door = DoorState::Draining;
            self.changed.notify_all();
        }
        self.wait_not_listening();
        for connection in locked(&self.connections).values() {
            if !connection.busy {
                let _ = connection.stream.shutdown(Shutdown::Both);
            }
        }
    }

    /// Open connections.
    pub fn open_connections(&self) -> usize {
        locked(&self.connections).len()
    }

    fn serve(&self, stream: TcpStream, handle: &dyn Fn(&Request, &mut TcpStream) -> bool) {
        let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
        let stream = Arc::new(stream);
        let connection = Connection {
            stream: Arc::clone(&stream),
            busy: false,
        };
        locked(&self.connections).insert(id, connection);
        http1::serve(&stream, |request, out| {
            if let Some(connection) = locked(&self.connections).get_mut(&id) {
                connection.busy = true;
            }
            let keep = handle(request, out);
            if let Some(connection) = locked(&self.connections).get_mut(&id) {
                connection.busy = false;
            }
            keep && !self.draining()
        });
        locked(&self.connections).remove(&id);
    }
}

static TERMINATED: AtomicBool = AtomicBool::new(false);

#[cfg(unix)]
extern "C" fn on_sigterm(_signal: libc::c_int) {
    // Only an atomic store: anything more is not async-signal-safe.
    TERMINATED.store(true, Ordering::SeqCst);
}

/// On SIGTERM, drains every door and exits once their connections are gone, or after
/// `timeout`.
pub fn stop_gracefully_on_sigterm(doors: Vec<Arc<Door>>, timeout: Duration) {
    #[cfg(unix)]
    unsafe {
        libc::signal(
            libc::SIGTERM,
            on_sigterm as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
    thread::spawn(move || {
        while !TERMINATED.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(5));
        }
        for door in &doors {
            door.drain();
        }
        let deadline = Instant::now() + timeout;
        while doors.iter().any(|door| door.open_connections() > 0) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        std::process::exit(0);
    });
}
