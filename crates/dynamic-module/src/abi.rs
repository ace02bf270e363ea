//! The part of Envoy's dynamic-module ABI this module uses, written by hand against the ABI
//! header of the Envoy the project pins (1.40.0, ABI `v0.2.0`): its C types, and the callbacks
//! Envoy implements, looked up by name once at load. A callback this Envoy lacks fails the load
//! with its name, rather than abort Envoy at its first call.

use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

/// The ABI version the bindings are written for; Envoy compares it with its own at load.
pub const ABI_VERSION: &CStr = c"v0.2.0";
/// The Envoy release whose ABI header the bindings follow.
pub const ENVOY_VERSION: &str = "1.40.0";

/// A pointer Envoy owns (a config, a stream, a scheduler) and hands back on every call. Raw
/// pointers are not `Send`; these are only an address to Envoy, which says from which threads
/// each may be used (see the callers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EnvoyPtr(pub *mut c_void);

// SAFETY: an opaque handle: this module never dereferences it, and each use keeps to the thread
// rules the ABI states for that callback (main thread, the stream's worker, or any thread).
unsafe impl Send for EnvoyPtr {}
// SAFETY: as above.
unsafe impl Sync for EnvoyPtr {}

impl EnvoyPtr {
    pub fn is_null(self) -> bool {
        self.0.is_null()
    }
}

/// Bytes Envoy owns, valid for the callback that handed them out.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

impl EnvoyBuffer {
    pub const EMPTY: EnvoyBuffer = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };

    /// The bytes, borrowed for as long as Envoy keeps them (the current callback).
    ///
    /// # Safety
    /// `ptr` must be null or point at `length` readable bytes for the borrow's lifetime.
    pub unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() || self.length == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(self.ptr, self.length)
        }
    }
}

/// Bytes this module owns, read by Envoy during the call only.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

impl ModuleBuffer {
    pub fn of(bytes: &[u8]) -> ModuleBuffer {
        ModuleBuffer {
            ptr: bytes.as_ptr(),
            length: bytes.len(),
        }
    }

    /// A null buffer: `set_header` with it removes the header.
    pub const NULL: ModuleBuffer = ModuleBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };
}

/// One header this module hands to Envoy.
#[repr(C)]
pub struct ModuleHeader {
    pub key_ptr: *const u8,
    pub key_length: usize,
    pub value_ptr: *const u8,
    pub value_length: usize,
}

impl ModuleHeader {
    pub fn of(key: &str, value: &str) -> ModuleHeader {
        ModuleHeader {
            key_ptr: key.as_ptr(),
            key_length: key.len(),
            value_ptr: value.as_ptr(),
            value_length: value.len(),
        }
    }
}

/// One header Envoy hands to this module.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyHeader {
    pub key_ptr: *const u8,
    pub key_length: usize,
    pub value_ptr: *const u8,
    pub value_length: usize,
}

impl EnvoyHeader {
    pub const EMPTY: EnvoyHeader = EnvoyHeader {
        key_ptr: std::ptr::null(),
        key_length: 0,
        value_ptr: std::ptr::null(),
        value_length: 0,
    };

    /// # Safety
    /// Both pointers must be valid for their lengths (or null) for the borrow's lifetime.
    pub unsafe fn pair<'a>(self) -> (&'a [u8], &'a [u8]) {
        let key = EnvoyBuffer {
            ptr: self.key_ptr,
            length: self.key_length,
        };
        let value = EnvoyBuffer {
            ptr: self.value_ptr,
            length: self.value_length,
        };
        (key.bytes(), value.bytes())
    }
}

/// `envoy_dynamic_module_type_http_header_type`.
pub mod header_map {
    pub const REQUEST: u32 = 0;
    pub const RESPONSE: u32 = 2;
}

/// `envoy_dynamic_module_type_http_body_type`: the chunk of the current body callback, or what
/// Envoy buffered before it.
pub mod body {
    pub const RECEIVED_REQUEST: u32 = 0;
    pub const BUFFERED_REQUEST: u32 = 1;
}

/// `envoy_dynamic_module_type_metadata_source`.
pub const METADATA_DYNAMIC: u32 = 0;
/// `envoy_dynamic_module_type_attribute_id` of `upstream.address` ("ip:port").
pub const ATTRIBUTE_UPSTREAM_ADDRESS: u32 = 41;
/// `envoy_dynamic_module_type_attribute_id` of `destination.port` (the listener's port).
pub const ATTRIBUTE_DESTINATION_PORT: u32 = 27;
/// `envoy_dynamic_module_type_http_callout_init_result`: only success sends a callout.
pub const CALLOUT_INIT_SUCCESS: u32 = 0;
/// `envoy_dynamic_module_type_http_callout_result`.
pub const CALLOUT_SUCCESS: u32 = 0;
/// `envoy_dynamic_module_type_metrics_result`.
pub const METRICS_SUCCESS: u32 = 0;

/// The request-side statuses a hook returns (Envoy's FilterHeadersStatus, FilterDataStatus and
/// FilterTrailersStatus): go on, or stop here (buffering the body while stopped).
pub mod status {
    pub const CONTINUE: u32 = 0;
    pub const HEADERS_STOP_ITERATION: u32 = 1;
    pub const BODY_STOP_AND_BUFFER: u32 = 1;
    pub const BODY_STOP_NO_BUFFER: u32 = 3;
    pub const TRAILERS_STOP_ITERATION: u32 = 1;
}

/// Declares the callback table: one field per Envoy callback, named after its symbol without
/// the `envoy_dynamic_module_callback_` prefix, resolved by [`Callbacks::resolve`].
macro_rules! callbacks {
    ($($name:ident: fn($($arg:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        /// Envoy's callbacks, resolved once by name.
        pub struct Callbacks {
            $(pub $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
        }

        impl Callbacks {
            /// Every callback by name, or the first one this Envoy does not export.
            fn resolve() -> Result<Callbacks, &'static str> {
                Ok(Callbacks {
                    $($name: {
                        let symbol = concat!("envoy_dynamic_module_callback_", stringify!($name), "\0");
                        let address = lookup(symbol)?;
                        // SAFETY: the symbol is Envoy's callback of that name, whose C signature
                        // (from the ABI header of the pinned Envoy) is the one declared here.
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) $(-> $ret)?>(address)
                        }
                    },)*
                })
            }
        }
    };
}

type Ptr = *mut c_void;

callbacks! {
    log: fn(u32, ModuleBuffer);
    get_log_level: fn() -> u32;
    http_get_header: fn(Ptr, u32, ModuleBuffer, *mut EnvoyBuffer, usize, *mut usize) -> bool;
    http_get_headers_size: fn(Ptr, u32) -> usize;
    http_get_headers: fn(Ptr, u32, *mut EnvoyHeader) -> bool;
    http_set_header: fn(Ptr, u32, ModuleBuffer, ModuleBuffer) -> bool;
    http_get_body_chunks_size: fn(Ptr, u32) -> usize;
    http_get_body_chunks: fn(Ptr, u32, *mut EnvoyBuffer) -> bool;
    http_received_buffered_request_body: fn(Ptr) -> bool;
    http_append_body: fn(Ptr, u32, ModuleBuffer) -> bool;
    http_drain_body: fn(Ptr, u32, usize) -> bool;
    http_get_body_size: fn(Ptr, u32) -> usize;
    http_send_response: fn(Ptr, u32, *mut ModuleHeader, usize, ModuleBuffer, ModuleBuffer);
    http_set_dynamic_metadata_string: fn(Ptr, ModuleBuffer, ModuleBuffer, ModuleBuffer);
    http_get_metadata_string: fn(Ptr, u32, ModuleBuffer, ModuleBuffer, *mut EnvoyBuffer) -> bool;
    http_get_metadata_list_size: fn(Ptr, u32, ModuleBuffer, ModuleBuffer, *mut usize) -> bool;
    http_get_metadata_list_string: fn(Ptr, u32, ModuleBuffer, ModuleBuffer, usize, *mut EnvoyBuffer) -> bool;
    http_filter_get_attribute_string: fn(Ptr, u32, *mut EnvoyBuffer) -> bool;
    http_filter_get_attribute_int: fn(Ptr, u32, *mut u64) -> bool;
    http_filter_continue_decoding: fn(Ptr);
    http_clear_route_cache: fn(Ptr);
    http_filter_scheduler_new: fn(Ptr) -> Ptr;
    http_filter_scheduler_commit: fn(Ptr, u64);
    http_filter_scheduler_delete: fn(Ptr);
    http_filter_config_scheduler_new: fn(Ptr) -> Ptr;
    http_filter_config_scheduler_commit: fn(Ptr, u64);
    http_filter_config_scheduler_delete: fn(Ptr);
    http_filter_config_http_callout: fn(Ptr, *mut u64, ModuleBuffer, *mut ModuleHeader, usize, ModuleBuffer, u64) -> u32;
    http_filter_config_define_counter: fn(Ptr, ModuleBuffer, *mut ModuleBuffer, usize, *mut usize) -> u32;
    http_filter_config_define_gauge: fn(Ptr, ModuleBuffer, *mut ModuleBuffer, usize, *mut usize) -> u32;
    http_filter_config_define_histogram: fn(Ptr, ModuleBuffer, *mut ModuleBuffer, usize, *mut usize) -> u32;
    http_filter_config_increment_counter: fn(Ptr, usize, *mut ModuleBuffer, usize, u64) -> u32;
    http_filter_config_increment_gauge: fn(Ptr, usize, *mut ModuleBuffer, usize, u64) -> u32;
    http_filter_config_decrement_gauge: fn(Ptr, usize, *mut ModuleBuffer, usize, u64) -> u32;
    http_filter_config_set_gauge: fn(Ptr, usize, *mut ModuleBuffer, usize, u64) -> u32;
    http_filter_config_record_histogram_value: fn(Ptr, usize, *mut ModuleBuffer, usize, u64) -> u32;
}

/// `dlsym`'s handle for "the process and its libraries, in load order": Envoy's own binary
/// exports the callbacks.
const RTLD_DEFAULT: *mut c_void = std::ptr::null_mut();

extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

/// The address of `symbol` (NUL-terminated), or its name when this process has none.
fn lookup(symbol: &'static str) -> Result<*mut c_void, &'static str> {
    let name = symbol.trim_end_matches('\0');
    if !symbol.ends_with('\0') {
        return Err(name);
    }
    // SAFETY: `symbol` is a NUL-terminated static string.
    let address = unsafe { dlsym(RTLD_DEFAULT, symbol.as_ptr().cast()) };
    if address.is_null() {
        Err(name)
    } else {
        Ok(address)
    }
}

static CALLBACKS: OnceLock<Callbacks> = OnceLock::new();

/// Resolves every callback; on failure, the missing callback's name.
pub fn load() -> Result<(), &'static str> {
    if CALLBACKS.get().is_none() {
        let resolved = Callbacks::resolve()?;
        let _ = CALLBACKS.set(resolved);
    }
    Ok(())
}

/// The resolved callbacks; `None` only before a successful [`load`], when Envoy makes no other
/// call into the module (it refuses to load it).
pub fn envoy() -> Option<&'static Callbacks> {
    CALLBACKS.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_callback_is_named() {
        assert_eq!(
            lookup("envoy_dynamic_module_callback_not_in_this_process\0"),
            Err("envoy_dynamic_module_callback_not_in_this_process")
        );
        assert!(lookup("malloc\0").is_ok());
        // Outside Envoy (this test binary) the table cannot resolve, and says which callback.
        assert!(Callbacks::resolve()
            .err()
            .is_some_and(|name| name.starts_with("envoy_dynamic_module_callback_")));
    }
}
