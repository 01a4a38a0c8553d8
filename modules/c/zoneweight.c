/*
 * zoneweight — the smallest edgeproxy policy module that weights
 * endpoints, in plain C with no SDK: an endpoint in this node's zone gets
 * four times its input weight (at most EP_MAX_WEIGHT), the others keep
 * theirs. It implements ABI 1.0 only (no batch export), to show that the
 * host still calls such a module, one call per service port.
 *
 *   clang --target=wasm32-wasi -mexec-model=reactor -mbulk-memory -O2 -o zoneweight.wasm zoneweight.c
 */
#include <stdlib.h>

#include "edgeproxy_abi.h"

static uint8_t *in;      /* the buffer ep_alloc hands out */
static uint32_t in_cap;
static uint8_t *out;     /* the encoded output */
static uint32_t out_cap;

static const char reason[] = "same zone x4";

EP_EXPORT(edgeproxy_abi_v1) void marker(void) {}

/* Returns a buffer of at least size bytes, valid until the next call. */
EP_EXPORT(ep_alloc) uint8_t *ep_alloc(int32_t size) {
	if (size < 1)
		size = 1;
	if ((uint32_t)size > in_cap) {
		free(in);
		in = malloc((size_t)size);
		in_cap = in ? (uint32_t)size : 0;
	}
	return in;
}

/* No config: any JSON object is accepted. */
EP_EXPORT(ep_init) int32_t ep_init(uint8_t *cfg, int32_t len) {
	(void)cfg;
	(void)len;
	return 0;
}

EP_EXPORT(ep_evaluate) int64_t ep_evaluate(uint8_t *buf, int32_t len) {
	if (len < 0 || (uint32_t)len > in_cap)
		return 0;
	ep_reader r = {buf, buf + len, 0};
	ep_service svc;
	ep_node node;
	uint32_t count = ep_read_header(&r, &svc, &node);
	if (r.bad) {
		ep_log(EP_ERROR, "input does not decode", 21);
		return 0;
	}
	uint32_t size = EP_OUTPUT_SIZE(count, sizeof reason - 1);
	if (size > out_cap) {
		free(out);
		out = malloc(size);
		out_cap = out ? size : 0;
		if (!out)
			return 0;
	}
	uint8_t *w = ep_put_output_header(out, count);
	for (uint32_t i = 0; i < count; i++) {
		ep_endpoint e;
		ep_read_endpoint(&r, &e);
		uint32_t weight = e.weight;
		if (e.zone.n > 0 && ep_str_eq(e.zone, node.zone))
			weight = weight * 4 > EP_MAX_WEIGHT ? EP_MAX_WEIGHT : weight * 4;
		w = ep_put_u32(w, weight);
	}
	if (r.bad || r.p != r.end) {
		ep_log(EP_ERROR, "input does not decode", 21);
		return 0;
	}
	w = ep_put_output_tail(w, reason);
	return ep_packed(out, (uint32_t)(w - out));
}
