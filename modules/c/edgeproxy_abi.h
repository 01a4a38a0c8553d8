/*
 * edgeproxy_abi.h — the edgeproxy policy ABI (version 1.1) for C: the
 * constants of policy/abi/ABI.md, the decoded shapes of an input, and
 * small inline readers and writers for the wire encoding. No library
 * beyond the C standard headers; a module builds with
 *
 *   clang --target=wasm32-wasi -mexec-model=reactor -mbulk-memory -O2 -o m.wasm m.c
 *
 * and exports ep_alloc, ep_init and ep_evaluate with EP_EXPORT (and, for
 * ABI 1.1, optionally ep_evaluate_batch).
 */
#ifndef EDGEPROXY_ABI_H
#define EDGEPROXY_ABI_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>

#define EP_ABI_VERSION 1u      /* first word of every encoding */
#define EP_ABI_MINOR 1u        /* 1.1 adds the optional batch export */
#define EP_MAX_WEIGHT 10000u   /* largest weight of an endpoint */
#define EP_MAX_REASON 256u     /* bytes of the reason string */
#define EP_MAX_FLAGS 4u        /* scheduler flags */
#define EP_MAX_BATCH_COUNT 1024u
#define EP_MAX_BATCH_BYTES (1u << 20)

/* Endpoint flag bits. */
#define EP_READY 0x1u
#define EP_SERVING 0x2u
#define EP_TERMINATING 0x4u
#define EP_LOCAL 0x8u /* on this node */

/* Log levels of ep_log. */
#define EP_DEBUG 0
#define EP_INFO 1
#define EP_WARN 2
#define EP_ERROR 3

#define EP_EXPORT(name) __attribute__((export_name(#name)))

/* edgeproxy.log(level, ptr, len): the host's log function. */
__attribute__((import_module("edgeproxy"), import_name("log")))
void ep_log(int32_t level, const char *msg, int32_t len);

/* A string of the input: UTF-8 bytes, not NUL-terminated, pointing into
 * the input buffer. */
typedef struct {
	const uint8_t *p;
	uint32_t n;
} ep_str;

/* A list of strings or of key/value pairs, still encoded: count items
 * starting at p (read them with ep_reader). */
typedef struct {
	const uint8_t *p;
	uint32_t count;
} ep_list;

typedef struct {
	ep_str ns, name, port_name, protocol;
	uint16_t port;
	ep_list labels, annotations; /* kvs, sorted by key */
} ep_service;

typedef struct {
	ep_str name, zone, region;
	ep_list labels;
} ep_node;

typedef struct {
	uint8_t flags;     /* EP_READY | EP_SERVING | EP_TERMINATING | EP_LOCAL */
	uint8_t addr_len;  /* 4 or 16 */
	uint8_t addr[16];  /* network order */
	uint16_t port;
	uint32_t weight;   /* the previous module's weight, 1 for the first */
	ep_str node_name, zone;
	ep_list hint_zones, hint_nodes; /* strs */
} ep_endpoint;

/* ep_reader reads the little-endian wire encoding; a read past the end
 * sets bad and returns zero values, so a caller checks once at the end. */
typedef struct {
	const uint8_t *p, *end;
	int bad;
} ep_reader;

static inline const uint8_t *ep_take(ep_reader *r, uint32_t n) {
	if ((size_t)(r->end - r->p) < n) {
		r->bad = 1;
		r->p = r->end;
		return NULL;
	}
	const uint8_t *s = r->p;
	r->p += n;
	return s;
}

static inline uint16_t ep_u16(ep_reader *r) {
	const uint8_t *s = ep_take(r, 2);
	return s ? (uint16_t)(s[0] | s[1] << 8) : 0;
}

static inline uint32_t ep_u32(ep_reader *r) {
	const uint8_t *s = ep_take(r, 4);
	return s ? (uint32_t)s[0] | (uint32_t)s[1] << 8 | (uint32_t)s[2] << 16 | (uint32_t)s[3] << 24 : 0;
}

static inline ep_str ep_read_str(ep_reader *r) {
	ep_str s;
	s.n = ep_u16(r);
	s.p = ep_take(r, s.n);
	if (!s.p)
		s.n = 0;
	return s;
}

/* strs (pairs = 1) or kvs (pairs = 2). */
static inline ep_list ep_read_list(ep_reader *r, int pairs) {
	ep_list l;
	l.count = ep_u16(r);
	l.p = r->p;
	for (uint32_t i = 0; i < l.count * (uint32_t)pairs && !r->bad; i++)
		ep_read_str(r);
	return l;
}

static inline int ep_str_eq(ep_str a, ep_str b) {
	return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0);
}

/* Reads the header of an input (everything before the endpoints) and
 * returns the endpoint count; 0 with r->bad set on a bad input. */
static inline uint32_t ep_read_header(ep_reader *r, ep_service *s, ep_node *n) {
	if (ep_u32(r) != EP_ABI_VERSION) {
		r->bad = 1;
		return 0;
	}
	s->ns = ep_read_str(r);
	s->name = ep_read_str(r);
	s->port_name = ep_read_str(r);
	s->protocol = ep_read_str(r);
	s->port = ep_u16(r);
	s->labels = ep_read_list(r, 2);
	s->annotations = ep_read_list(r, 2);
	n->name = ep_read_str(r);
	n->zone = ep_read_str(r);
	n->region = ep_read_str(r);
	n->labels = ep_read_list(r, 2);
	uint32_t count = ep_u32(r);
	if (count > (uint32_t)(r->end - r->p) / 10) /* an endpoint takes >= 10 bytes */
		r->bad = 1;
	return r->bad ? 0 : count;
}

/* Reads one endpoint. */
static inline void ep_read_endpoint(ep_reader *r, ep_endpoint *e) {
	const uint8_t *f = ep_take(r, 2);
	e->flags = f ? f[0] : 0;
	e->addr_len = f ? f[1] : 0;
	if (e->addr_len != 0 && e->addr_len != 4 && e->addr_len != 16) {
		r->bad = 1;
		return;
	}
	const uint8_t *a = ep_take(r, e->addr_len);
	if (a)
		memcpy(e->addr, a, e->addr_len);
	e->port = ep_u16(r);
	e->weight = ep_u32(r);
	e->node_name = ep_read_str(r);
	e->zone = ep_read_str(r);
	e->hint_zones = ep_read_list(r, 1);
	e->hint_nodes = ep_read_list(r, 1);
}

/* Output writers: the caller provides a buffer of at least
 * 8 + 4*count + 6 + reason bytes (EP_OUTPUT_SIZE). */
#define EP_OUTPUT_SIZE(count, reason_len) (8u + 4u * (count) + 6u + (reason_len))

static inline uint8_t *ep_put_u32(uint8_t *b, uint32_t v) {
	b[0] = (uint8_t)v;
	b[1] = (uint8_t)(v >> 8);
	b[2] = (uint8_t)(v >> 16);
	b[3] = (uint8_t)(v >> 24);
	return b + 4;
}

static inline uint8_t *ep_put_u16(uint8_t *b, uint16_t v) {
	b[0] = (uint8_t)v;
	b[1] = (uint8_t)(v >> 8);
	return b + 2;
}

/* Writes the output header (version, weight count); the weights follow. */
static inline uint8_t *ep_put_output_header(uint8_t *b, uint32_t count) {
	return ep_put_u32(ep_put_u32(b, EP_ABI_VERSION), count);
}

/* Writes what follows the weights: no scheduler, no flags, the reason. */
static inline uint8_t *ep_put_output_tail(uint8_t *b, const char *reason) {
	uint16_t n = (uint16_t)strlen(reason);
	b = ep_put_u16(b, 0); /* scheduler "" */
	b = ep_put_u16(b, 0); /* no scheduler flags */
	b = ep_put_u16(b, n);
	memcpy(b, reason, n);
	return b + n;
}

/* The packed return value of ep_evaluate: ptr << 32 | len. */
static inline int64_t ep_packed(const void *p, uint32_t len) {
	return (int64_t)((uint64_t)(uintptr_t)p << 32 | len);
}

#endif
