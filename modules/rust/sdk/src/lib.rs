//! Write edgeproxy policy modules in Rust: the exports of ABI 1.1
//! (`policy/abi/ABI.md`), the input decoder and the output encoder, with no
//! dependencies, for `wasm32-unknown-unknown` (no imports but the host's
//! `edgeproxy.log`).
//!
//! ```ignore
//! use edgeproxy_sdk::{Input, Output};
//!
//! fn evaluate(input: &Input, out: &mut Output) -> Result<(), &'static str> {
//!     for (i, e) in input.endpoints.iter().enumerate() {
//!         if !edgeproxy_sdk::eq(e.zone, input.node.zone) {
//!             out.weights[i] = 0;
//!         }
//!     }
//!     Ok(())
//! }
//!
//! edgeproxy_sdk::module!(init: edgeproxy_sdk::no_config, evaluate: evaluate);
//! ```
//!
//! Strings are the input's bytes (`&[u8]`, UTF-8 on the wire), borrowed
//! from the host's buffer for the duration of one evaluation: nothing is
//! copied or allocated per call. Under the host's deadline every taken
//! loop back-edge costs a call into the host (~30 ns, RATIONALE.md): the
//! decoder has one loop per endpoint and none per string, and [`eq`]
//! compares short strings without a loop.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod json;

/// ABI version: the marker export, and the first word of every encoding.
pub const VERSION: u32 = 1;
/// The largest weight a module may give an endpoint.
pub const MAX_WEIGHT: u32 = 10000;
/// Log levels of [`log`].
pub const DEBUG: i32 = 0;
pub const INFO: i32 = 1;
pub const WARN: i32 = 2;
pub const ERROR: i32 = 3;

/// Endpoint flag bits.
const READY: u8 = 1;
const SERVING: u8 = 2;
const TERMINATING: u8 = 4;
const LOCAL: u8 = 8;

/// A list of strings (`strs` on the wire), iterated in place.
#[derive(Clone, Copy, Default)]
pub struct Strs<'a> {
    raw: &'a [u8],
    count: usize,
}

impl<'a> Strs<'a> {
    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    pub fn iter(&self) -> StrsIter<'a> {
        StrsIter { r: Reader { b: self.raw, p: 0, bad: false }, left: self.count }
    }
}

pub struct StrsIter<'a> {
    r: Reader<'a>,
    left: usize,
}

impl<'a> Iterator for StrsIter<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        Some(self.r.str())
    }
}

/// Labels or annotations (`kvs` on the wire), sorted by key.
#[derive(Clone, Copy, Default)]
pub struct Kvs<'a> {
    raw: &'a [u8],
    count: usize,
}

impl<'a> Kvs<'a> {
    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    /// The value of key.
    pub fn get(&self, key: &[u8]) -> Option<&'a [u8]> {
        let mut r = Reader { b: self.raw, p: 0, bad: false };
        for _ in 0..self.count {
            let k = r.str();
            let v = r.str();
            if eq(k, key) {
                return Some(v);
            }
        }
        None
    }
}

/// The service port being evaluated.
#[derive(Default)]
pub struct Service<'a> {
    pub namespace: &'a [u8],
    pub name: &'a [u8],
    pub port_name: &'a [u8],
    pub protocol: &'a [u8],
    pub port: u16,
    pub labels: Kvs<'a>,
    pub annotations: Kvs<'a>,
}

/// The node the proxy runs on.
#[derive(Default)]
pub struct Node<'a> {
    pub name: &'a [u8],
    pub zone: &'a [u8],
    pub region: &'a [u8],
    pub labels: Kvs<'a>,
}

/// One endpoint after built-in selection.
#[derive(Clone, Copy, Default)]
pub struct Endpoint<'a> {
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// On this node.
    pub local: bool,
    /// 4 or 16 bytes, network order (empty if the host sent none).
    pub addr: &'a [u8],
    pub port: u16,
    /// The previous module's weight, 1 for the first module.
    pub weight: u32,
    pub node_name: &'a [u8],
    pub zone: &'a [u8],
    pub hint_zones: Strs<'a>,
    pub hint_nodes: Strs<'a>,
}

/// What a module is called with.
#[derive(Default)]
pub struct Input<'a> {
    pub service: Service<'a>,
    pub node: Node<'a>,
    pub endpoints: &'a [Endpoint<'a>],
}

/// A module's answer. `weights` arrives filled with the input weights.
pub struct Output {
    pub weights: Vec<u32>,
    /// "" keeps the node's default IPVS scheduler.
    pub scheduler: &'static str,
    pub scheduler_flags: &'static [&'static str],
    /// Shown in the explain view; at most 256 bytes.
    pub reason: Vec<u8>,
}

/// Compares two byte strings like `==`, without a loop for strings of up
/// to 16 bytes (node names, zones) and 8 bytes a step beyond.
#[inline]
pub fn eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n >= 8 {
        if n <= 16 {
            return (le64(a, 0) ^ le64(b, 0)) | (le64(a, n - 8) ^ le64(b, n - 8)) == 0;
        }
        return eq_long(a, b);
    }
    if n >= 4 {
        return (le32(a, 0) ^ le32(b, 0)) | (le32(a, n - 4) ^ le32(b, n - 4)) == 0;
    }
    if n == 0 {
        return true;
    }
    (a[0] ^ b[0]) | (a[n / 2] ^ b[n / 2]) | (a[n - 1] ^ b[n - 1]) == 0
}

#[inline(never)]
fn eq_long(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    let mut i = 0;
    while i + 8 < n {
        if le64(a, i) != le64(b, i) {
            return false;
        }
        i += 8;
    }
    le64(a, n - 8) == le64(b, n - 8)
}

/// Whether s begins with prefix, with [`eq`].
#[inline]
pub fn has_prefix(s: &[u8], prefix: &[u8]) -> bool {
    s.len() >= prefix.len() && eq(&s[..prefix.len()], prefix)
}

#[inline]
fn le32(s: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]])
}

#[inline]
fn le64(s: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&s[i..i + 8]);
    u64::from_le_bytes(w)
}

/// A little-endian reader: a read past the end returns zero values and
/// sets `bad`, checked once at the end.
struct Reader<'a> {
    b: &'a [u8],
    p: usize,
    bad: bool,
}

impl<'a> Reader<'a> {
    #[inline]
    fn take(&mut self, n: usize) -> &'a [u8] {
        match self.b.get(self.p..self.p + n) {
            Some(s) => {
                self.p += n;
                s
            }
            None => {
                self.bad = true;
                self.p = self.b.len();
                &[]
            }
        }
    }
    #[inline]
    fn u8(&mut self) -> u8 {
        let s = self.take(1);
        if s.is_empty() {
            0
        } else {
            s[0]
        }
    }
    #[inline]
    fn u16(&mut self) -> u16 {
        let s = self.take(2);
        if s.len() < 2 {
            0
        } else {
            u16::from_le_bytes([s[0], s[1]])
        }
    }
    #[inline]
    fn u32(&mut self) -> u32 {
        let s = self.take(4);
        if s.len() < 4 {
            0
        } else {
            le32(s, 0)
        }
    }
    #[inline]
    fn str(&mut self) -> &'a [u8] {
        let n = self.u16() as usize;
        self.take(n)
    }
    /// strs: the common cases (none, one) without a loop.
    #[inline]
    fn strs(&mut self) -> Strs<'a> {
        let count = self.u16() as usize;
        let start = self.p;
        match count {
            0 => {}
            1 => {
                self.str();
            }
            _ => {
                for _ in 0..count {
                    self.str();
                }
            }
        }
        Strs { raw: &self.b[start..self.p], count }
    }
    fn kvs(&mut self) -> Kvs<'a> {
        let count = self.u16() as usize;
        let start = self.p;
        for _ in 0..count {
            self.str();
            self.str();
        }
        Kvs { raw: &self.b[start..self.p], count }
    }
}

/// Decodes one input into `input`, its endpoints into `eps`. False when
/// the bytes are not a valid input.
/// Each endpoint's weight goes to weights too (the output's starting
/// point), in the same loop: every loop iteration counts in a guest.
fn decode<'a>(b: &'a [u8], input: &mut Input<'a>, eps: &mut Vec<Endpoint<'a>>, weights: &mut Vec<u32>) -> bool {
    let mut r = Reader { b, p: 0, bad: false };
    if r.u32() != VERSION {
        return false;
    }
    let s = &mut input.service;
    s.namespace = r.str();
    s.name = r.str();
    s.port_name = r.str();
    s.protocol = r.str();
    s.port = r.u16();
    s.labels = r.kvs();
    s.annotations = r.kvs();
    let n = &mut input.node;
    n.name = r.str();
    n.zone = r.str();
    n.region = r.str();
    n.labels = r.kvs();
    let count = r.u32() as usize;
    if r.bad || count > (b.len() - r.p) / 10 {
        return false;
    }
    eps.clear();
    eps.reserve(count);
    weights.clear();
    weights.reserve(count);
    for _ in 0..count {
        let f = r.u8();
        let al = r.u8() as usize;
        let addr = r.take(al);
        let port = r.u16();
        let weight = r.u32();
        let node_name = r.str();
        let zone = r.str();
        let hint_zones = r.strs();
        let hint_nodes = r.strs();
        r.bad |= al != 0 && al != 4 && al != 16;
        weights.push(weight);
        eps.push(Endpoint {
            ready: f & READY != 0,
            serving: f & SERVING != 0,
            terminating: f & TERMINATING != 0,
            local: f & LOCAL != 0,
            addr,
            port,
            weight,
            node_name,
            zone,
            hint_zones,
            hint_nodes,
        });
    }
    !r.bad && r.p == b.len()
}

#[inline]
fn put_u16(b: &mut Vec<u8>, v: u16) {
    b.extend_from_slice(&v.to_le_bytes());
}

#[inline]
fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}

fn put_str(b: &mut Vec<u8>, s: &[u8]) {
    let n = s.len().min(0xffff);
    put_u16(b, n as u16);
    b.extend_from_slice(&s[..n]);
}

/// Appends the encoding of out to b.
fn encode(b: &mut Vec<u8>, out: &Output) {
    let n = out.weights.len();
    b.reserve(8 + n * 4 + 6 + out.reason.len());
    put_u32(b, VERSION);
    put_u32(b, n as u32);
    // The weights in one copy, not one write each: wasm32 is little-endian
    // like the encoding.
    // SAFETY: n u32s are n*4 initialized bytes.
    b.extend_from_slice(unsafe { std::slice::from_raw_parts(out.weights.as_ptr() as *const u8, n * 4) });
    put_str(b, out.scheduler.as_bytes());
    put_u16(b, out.scheduler_flags.len() as u16);
    for f in out.scheduler_flags {
        put_str(b, f.as_bytes());
    }
    put_str(b, &out.reason);
}

#[link(wasm_import_module = "edgeproxy")]
extern "C" {
    #[link_name = "log"]
    fn host_log(level: i32, ptr: *const u8, len: i32);
}

/// Logs a line through the host (truncated to 512 bytes and rate limited
/// there).
pub fn log(level: i32, msg: &[u8]) {
    // SAFETY: the host only reads len bytes at ptr.
    unsafe { host_log(level, msg.as_ptr(), msg.len() as i32) }
}

/// The module's state, reused across calls so that an evaluation
/// allocates nothing once warm. A wasm instance is single-threaded and
/// the host never calls it re-entrantly.
pub struct State {
    input: Vec<u8>,
    eps: Vec<Endpoint<'static>>,
    out: Output,
    buf: Vec<u8>,
}

static mut STATE: State = State {
    input: Vec::new(),
    eps: Vec::new(),
    out: Output { weights: Vec::new(), scheduler: "", scheduler_flags: &[], reason: Vec::new() },
    buf: Vec::new(),
};

#[doc(hidden)]
pub fn state() -> &'static mut State {
    // SAFETY: single-threaded, and the exports below never hold two
    // references at once across a call into the module's code.
    unsafe { &mut *std::ptr::addr_of_mut!(STATE) }
}

#[doc(hidden)]
pub fn alloc(n: i32) -> i32 {
    let st = state();
    let n = n.max(1) as usize;
    if st.input.len() < n {
        st.input = vec![0; n];
    }
    st.input.as_ptr() as i32
}

#[doc(hidden)]
pub fn init(n: i32, f: fn(&[u8]) -> Result<(), &'static str>) -> i32 {
    let st = state();
    if n < 0 || n as usize > st.input.len() {
        return 1;
    }
    match f(&st.input[..n as usize]) {
        Ok(()) => 0,
        Err(e) => {
            log(ERROR, e.as_bytes());
            1
        }
    }
}

/// Evaluates one encoded input and appends the encoded output to buf;
/// false (and nothing appended) on failure.
#[inline(always)]
fn eval_into<F: Fn(&Input, &mut Output) -> Result<(), &'static str>>(
    item: &[u8],
    eps: &mut Vec<Endpoint<'static>>,
    out: &mut Output,
    buf: &mut Vec<u8>,
    f: &F,
) -> bool {
    // SAFETY: the endpoints borrow item only until this function returns;
    // the vector keeps its capacity between calls and is cleared first.
    let eps: &mut Vec<Endpoint<'_>> = unsafe { std::mem::transmute(eps) };
    let mut input = Input::default();
    if !decode(item, &mut input, eps, &mut out.weights) {
        eps.clear();
        log(ERROR, b"edgeproxy-sdk: input does not decode");
        return false;
    }
    // A view whose endpoints borrow eps only for the call.
    let view = Input { service: input.service, node: input.node, endpoints: eps.as_slice() };
    out.scheduler = "";
    out.scheduler_flags = &[];
    out.reason.clear();
    let ok = match f(&view, out) {
        Ok(()) => true,
        Err(e) => {
            log(ERROR, e.as_bytes());
            false
        }
    };
    eps.clear();
    if ok {
        encode(buf, out);
    }
    ok
}

#[inline]
fn packed(b: &[u8]) -> i64 {
    ((b.as_ptr() as u32 as u64) << 32 | b.len() as u64) as i64
}

#[doc(hidden)]
pub fn evaluate<F: Fn(&Input, &mut Output) -> Result<(), &'static str>>(n: i32, f: F) -> i64 {
    let st = state();
    if n < 0 || n as usize > st.input.len() {
        return 0;
    }
    st.buf.clear();
    if !eval_into(&st.input[..n as usize], &mut st.eps, &mut st.out, &mut st.buf, &f) {
        return 0;
    }
    packed(&st.buf)
}

#[doc(hidden)]
pub fn evaluate_batch<F: Fn(&Input, &mut Output) -> Result<(), &'static str>>(n: i32, f: F) -> i64 {
    let st = state();
    if n < 0 || n as usize > st.input.len() {
        return 0;
    }
    let b = &st.input[..n as usize];
    let mut r = Reader { b, p: 0, bad: false };
    let version = r.u32();
    let count = r.u32() as usize;
    if r.bad || version != VERSION || count > (b.len() - 8) / 4 {
        log(ERROR, b"edgeproxy-sdk: batch does not decode");
        return 0;
    }
    st.buf.clear();
    put_u32(&mut st.buf, VERSION);
    put_u32(&mut st.buf, count as u32);
    for _ in 0..count {
        let len = r.u32() as usize;
        let item = r.take(len);
        if r.bad {
            log(ERROR, b"edgeproxy-sdk: batch does not decode");
            return 0;
        }
        let at = st.buf.len();
        put_u32(&mut st.buf, 0);
        if eval_into(item, &mut st.eps, &mut st.out, &mut st.buf, &f) {
            let n = (st.buf.len() - at - 4) as u32;
            st.buf[at..at + 4].copy_from_slice(&n.to_le_bytes());
        }
    }
    if r.p != b.len() {
        log(ERROR, b"edgeproxy-sdk: batch does not decode");
        return 0;
    }
    packed(&st.buf)
}

/// An init function for modules without config: accepts any JSON object.
pub fn no_config(_: &[u8]) -> Result<(), &'static str> {
    Ok(())
}

/// Declares the module's exports: `init` receives the config (a JSON
/// object, `{}` when none; see [`json`]), `evaluate` one service port.
#[macro_export]
macro_rules! module {
    (init: $init:path, evaluate: $eval:path) => {
        #[no_mangle]
        pub extern "C" fn edgeproxy_abi_v1() {}
        #[no_mangle]
        pub extern "C" fn ep_alloc(n: i32) -> i32 {
            $crate::alloc(n)
        }
        #[no_mangle]
        pub extern "C" fn ep_init(_ptr: i32, n: i32) -> i32 {
            $crate::init(n, $init)
        }
        #[no_mangle]
        pub extern "C" fn ep_evaluate(_ptr: i32, n: i32) -> i64 {
            $crate::evaluate(n, $eval)
        }
        #[no_mangle]
        pub extern "C" fn ep_evaluate_batch(_ptr: i32, n: i32) -> i64 {
            $crate::evaluate_batch(n, $eval)
        }
    };
}
