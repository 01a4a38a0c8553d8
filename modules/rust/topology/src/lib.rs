//! The topology policy module in Rust: the same decisions, reasons and
//! config as the Go module in modules/topology (the conformance test
//! checks they answer byte for byte alike). It prefers endpoints on this
//! node, then in this zone, then in this region, then anywhere, moving to a
//! wider level only while the narrower one has fewer than minEndpoints.
//!
//! Config (all optional): `{"minEndpoints": 2, "levels": ["node", "zone",
//! "region", "any"], "regions": {"zone-a": "eu-1"}}`; without a regions
//! entry a zone belongs to the node's region when it starts with its name.

use edgeproxy_sdk::{eq, has_prefix, json, Input, Output};

const NODE: usize = 0;
const ZONE: usize = 1;
const REGION: usize = 2;
const ANY: usize = 3;
const LEVEL_NAMES: [&str; 4] = ["node", "zone", "region", "any"];

struct Config {
    min_endpoints: usize,
    levels: Vec<usize>,
    regions: Vec<(Vec<u8>, Vec<u8>)>,
}

static mut CONFIG: Config = Config { min_endpoints: 1, levels: Vec::new(), regions: Vec::new() };

/// Each endpoint's closest level, reused across calls.
static mut RANKS: Vec<u8> = Vec::new();

fn config() -> &'static Config {
    // SAFETY: written only by init, before any evaluation; single-threaded.
    unsafe { &*std::ptr::addr_of!(CONFIG) }
}

fn init(b: &[u8]) -> Result<(), &'static str> {
    let v = json::parse(b)?;
    if !matches!(v, json::Value::Object(_)) {
        return Err("config: not a JSON object");
    }
    let mut c = Config { min_endpoints: 1, levels: Vec::new(), regions: Vec::new() };
    if let Some(m) = v.field("minEndpoints") {
        let n = m.as_i64().ok_or("config: minEndpoints is not an integer")?;
        c.min_endpoints = n.max(1) as usize;
    }
    if let Some(ls) = v.field("levels") {
        let ls = match ls {
            json::Value::Array(ls) => ls,
            _ => return Err("config: levels is not a list"),
        };
        for l in ls {
            let name = l.as_str().ok_or("config: a level is not a string")?;
            let i = LEVEL_NAMES.iter().position(|n| *n == name).ok_or("topology: unknown level")?;
            c.levels.push(i);
        }
    }
    if c.levels.is_empty() {
        c.levels = vec![NODE, ZONE, REGION, ANY];
    }
    if let Some(rs) = v.field("regions") {
        let rs = match rs {
            json::Value::Object(rs) => rs,
            _ => return Err("config: regions is not an object"),
        };
        for (k, r) in rs {
            let r = r.as_str().ok_or("config: a region is not a string")?;
            // Like a Go map: a repeated key keeps its last value.
            c.regions.retain(|(z, _)| z.as_slice() != k.as_bytes());
            c.regions.push((k.as_bytes().to_vec(), r.as_bytes().to_vec()));
        }
    }
    // SAFETY: see config().
    unsafe { *std::ptr::addr_of_mut!(CONFIG) = c };
    Ok(())
}

/// The region of zone.
fn region<'a>(input: &Input<'a>, c: &'a Config, zone: &'a [u8]) -> &'a [u8] {
    if !c.regions.is_empty() {
        if let Some((_, r)) = c.regions.iter().find(|(z, _)| eq(z, zone)) {
            return r;
        }
    }
    let nr = input.node.region;
    if !nr.is_empty() && has_prefix(zone, nr) {
        return nr;
    }
    &[]
}

fn evaluate(input: &Input, out: &mut Output) -> Result<(), &'static str> {
    let c = config();
    let total = input.endpoints.len();
    if total == 0 {
        out.reason.extend_from_slice(b"no endpoints");
        return Ok(());
    }
    let mut node_region = input.node.region;
    if node_region.is_empty() {
        node_region = region(input, c, input.node.zone);
    }
    let node = input.node.name;
    let zone = input.node.zone;
    let closest = |e: &edgeproxy_sdk::Endpoint| -> usize {
        if e.local || (!e.node_name.is_empty() && eq(e.node_name, node)) {
            NODE
        } else if e.zone.is_empty() {
            ANY
        } else if eq(e.zone, zone) {
            ZONE
        } else if !node_region.is_empty() && eq(region(input, c, e.zone), node_region) {
            REGION
        } else {
            ANY
        }
    };
    // One pass: each endpoint's closest level, and how many endpoints are
    // at each level. Unrolled by four: each loop iteration costs a call
    // into the host under its deadline.
    // SAFETY: single-threaded; not held across calls.
    let ranks = unsafe { &mut *std::ptr::addr_of_mut!(RANKS) };
    ranks.clear();
    ranks.resize(total, 0);
    let eps = input.endpoints;
    let mut at = [0usize; 4];
    let mut i = 0;
    while i + 4 <= total {
        let (r0, r1, r2, r3) = (closest(&eps[i]), closest(&eps[i + 1]), closest(&eps[i + 2]), closest(&eps[i + 3]));
        at[r0] += 1;
        at[r1] += 1;
        at[r2] += 1;
        at[r3] += 1;
        ranks[i..i + 4].copy_from_slice(&[r0 as u8, r1 as u8, r2 as u8, r3 as u8]);
        i += 4;
    }
    while i < total {
        let r = closest(&eps[i]);
        at[r] += 1;
        ranks[i] = r as u8;
        i += 1;
    }
    let within = [at[0], at[0] + at[1], at[0] + at[1] + at[2], total];
    for &l in &c.levels {
        let n = within[l];
        if n == 0 || (n < c.min_endpoints && l != ANY) {
            continue;
        }
        drop_beyond(&mut out.weights, ranks, l as u8);
        out.reason.extend_from_slice(LEVEL_NAMES[l].as_bytes());
        out.reason.extend_from_slice(b": ");
        itoa(&mut out.reason, n);
        out.reason.extend_from_slice(b" of ");
        itoa(&mut out.reason, total);
        out.reason.extend_from_slice(b" endpoints");
        return Ok(());
    }
    out.reason.extend_from_slice(b"no level matched; all endpoints kept");
    Ok(())
}

/// Zeroes the weights of endpoints whose rank is beyond level l, four at
/// a time.
fn drop_beyond(weights: &mut [u32], ranks: &[u8], l: u8) {
    let keep = |w: u32, r: u8| if r > l { 0 } else { w };
    let n = weights.len().min(ranks.len());
    let mut i = 0;
    while i + 4 <= n {
        weights[i] = keep(weights[i], ranks[i]);
        weights[i + 1] = keep(weights[i + 1], ranks[i + 1]);
        weights[i + 2] = keep(weights[i + 2], ranks[i + 2]);
        weights[i + 3] = keep(weights[i + 3], ranks[i + 3]);
        i += 4;
    }
    while i < n {
        weights[i] = keep(weights[i], ranks[i]);
        i += 1;
    }
}

fn itoa(b: &mut Vec<u8>, mut n: usize) {
    let mut d = [0u8; 20];
    let mut i = d.len();
    loop {
        i -= 1;
        d[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    b.extend_from_slice(&d[i..]);
}

edgeproxy_sdk::module!(init: init, evaluate: evaluate);
