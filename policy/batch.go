package policy

import (
	"context"
	"crypto/sha256"
	"time"

	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// BatchResult is the outcome of one input of EvaluateBatch: a Result, or
// Err (a *CallError) when the module failed on that input.
type BatchResult struct {
	Result
	Err error
}

// pending is an input of EvaluateBatch that the cache did not answer.
type pending struct {
	idx        int      // in the caller's slice
	key        [32]byte // sha256 of the encoding
	start, end int      // the encoding, in Instance.encoded
	endpoints  int
	dupOf      int // -1, or the index of an equal input evaluated instead
}

func (p *pending) size() int { return p.end - p.start }

// EvaluateBatch evaluates each input as Evaluate would — same cache, same
// validation, same failure containment, one result per input in order —
// but calls a module that exports ep_evaluate_batch (ABI 1.1) once per
// batch of at most Options.BatchSize inputs and BatchBytes bytes, under a
// deadline of Timeout per input in the batch. Equal inputs are evaluated
// once.
//
// One input's bad output fails that input only. When the batch call
// itself fails (a trap, a timeout, a broken framing), none of its answers
// is used: the instance is discarded if it trapped or timed out, and the
// batch's inputs are evaluated again one call each, so that exactly the
// inputs that fail alone fail, with the breaker counting those calls as
// it always does (the failed batch call is not counted).
func (i *Instance) EvaluateBatch(ctx context.Context, ins []*abi.Input) []BatchResult {
	res := make([]BatchResult, len(ins))
	i.mu.Lock()
	defer i.mu.Unlock()
	i.encoded, i.todo = i.encoded[:0], i.todo[:0]
	var seen map[[32]byte]int
	for k, in := range ins {
		start := len(i.encoded)
		i.encoded = abi.AppendInput(i.encoded, in)
		key := sha256.Sum256(i.encoded[start:])
		if out, ok := i.cache.get(key); ok {
			res[k] = BatchResult{Result: Result{Output: cloneOutput(out), Cached: true}}
			i.encoded = i.encoded[:start]
			continue
		}
		p := pending{idx: k, key: key, start: start, end: len(i.encoded), endpoints: len(in.Endpoints), dupOf: -1}
		if seen == nil {
			seen = make(map[[32]byte]int, len(ins))
		}
		if j, ok := seen[key]; ok {
			p.dupOf = i.todo[j].idx
			i.encoded = i.encoded[:start]
		} else {
			seen[key] = len(i.todo)
		}
		i.todo = append(i.todo, p)
	}
	todo := i.todo
	for len(todo) > 0 {
		n, bytes := 0, 0
		for _, p := range todo {
			if p.dupOf < 0 {
				if n > 0 && (n == i.h.opts.BatchSize || bytes+p.size() > i.h.opts.BatchBytes) {
					break
				}
				bytes += p.size()
			}
			n++
		}
		i.evaluateChunk(ctx, todo[:n], res)
		todo = todo[n:]
	}
	for _, p := range i.todo {
		if p.dupOf >= 0 {
			r := res[p.dupOf]
			r.Output = cloneOutput(r.Output)
			res[p.idx] = r
		}
	}
	return res
}

// evaluateChunk evaluates one batch's worth of inputs (equal inputs
// marked dupOf are skipped) into res.
func (i *Instance) evaluateChunk(ctx context.Context, chunk []pending, res []BatchResult) {
	live := 0
	for _, p := range chunk {
		if p.dupOf < 0 {
			live++
		}
	}
	if live > 1 && i.batchReady(ctx) && i.tryBatch(ctx, chunk, live, res) {
		return
	}
	for _, p := range chunk {
		if p.dupOf < 0 {
			r, err := i.evaluateEncoded(ctx, p.key, i.encoded[p.start:p.end], p.endpoints)
			res[p.idx] = BatchResult{Result: r, Err: err}
		}
	}
}

// batchReady reports whether a batch call can be made now: the module
// exports ep_evaluate_batch, its circuit is closed and it has an instance
// (re-created here if its backoff is over). A failure to re-create is not
// counted here: the calls one by one that follow meet it again and count
// it as they always do.
func (i *Instance) batchReady(ctx context.Context) bool {
	now := i.h.opts.Now()
	if now.Before(i.openUntil) || i.compiled == nil {
		return false
	}
	if i.mod == nil && (now.Before(i.retryAt) || i.instantiate(ctx, true) != nil) {
		return false
	}
	return i.batch != nil
}

// tryBatch makes one ep_evaluate_batch call for the live inputs of chunk
// and fills their results; false when the call failed as a whole and
// nothing was filled.
func (i *Instance) tryBatch(ctx context.Context, chunk []pending, live int, res []BatchResult) bool {
	i.frame = abi.AppendBatchHeader(i.frame[:0], live)
	limit := uint32(8)
	for _, p := range chunk {
		if p.dupOf < 0 {
			i.frame = abi.AppendBatchItem(i.frame, i.encoded[p.start:p.end])
			limit += 4 + maxOutput(p.endpoints)
		}
	}
	start := time.Now()
	ce := i.call(ctx, i.h.opts.Timeout*time.Duration(live), i.batch, i.frame, limit, live)
	d := time.Since(start)
	if ce != nil {
		switch ce.Reason {
		case ReasonCanceled:
			if i.mod != nil && i.mod.IsClosed() {
				i.discard(ctx)
			}
			for _, p := range chunk {
				if p.dupOf < 0 {
					res[p.idx] = BatchResult{Err: ce}
				}
			}
			return true
		case ReasonTrap, ReasonTimeout:
			i.discard(ctx)
		}
		i.log.Debug("policy: batch call failed; evaluating its inputs one by one", "inputs", live, "err", ce)
		return false
	}
	var err error
	if i.items, err = abi.SplitBatch(i.items, i.out, live); err != nil {
		i.log.Debug("policy: batch output does not decode; evaluating its inputs one by one", "inputs", live, "err", err)
		return false
	}
	per := d / time.Duration(live)
	now := i.h.opts.Now()
	k := 0
	for _, p := range chunk {
		if p.dupOf >= 0 {
			continue
		}
		item := i.items[k]
		k++
		var ce *CallError
		var out abi.Output
		if len(item) == 0 {
			ce = i.callErr(ReasonInvalid, errReported)
		} else {
			out, ce = i.checkOutput(item, p.endpoints, !i.spec.AllowEmpty)
		}
		if ce != nil {
			res[p.idx] = BatchResult{Result: Result{Duration: per}, Err: i.fail(ctx, now, ce)}
			continue
		}
		i.succeed(now)
		i.cache.put(p.key, out)
		res[p.idx] = BatchResult{Result: Result{Output: cloneOutput(out), Duration: per}}
	}
	return true
}
