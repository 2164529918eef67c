package server

import (
	"sync"
	"time"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/pipeline"
)

// rateWindow is how far back the status rates look.
const rateWindow = 5 * time.Second

// rateSample is a session's byte counters at one moment.
type rateSample struct {
	at      time.Time
	in, out uint64
}

// rateTracker turns the counters seen at successive STATUS requests into MB/s over the
// last few seconds. Samples are taken only when someone asks, so an idle daemon does no
// work; the first request after a quiet spell reports the rate since the oldest sample
// still inside the window, or since the session started.
type rateTracker struct {
	mu      sync.Mutex
	started time.Time
	samples []rateSample
}

func (r *rateTracker) start(now time.Time, st pipeline.Stats) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started = now
	r.samples = []rateSample{{at: now, in: st.BytesIn, out: st.BytesOut}}
}

// fill sets the derived fields of st from the session's counters ss at now.
func (r *rateTracker) fill(st *control.SessionStatus, ss pipeline.Stats, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st.AgeS = now.Sub(r.started).Seconds()
	if ss.BytesOut > 0 {
		st.Ratio = float64(ss.BytesIn) / float64(ss.BytesOut)
	}
	if st.RingSize > 0 {
		st.RingFill = float64(ss.RingUsed) / float64(st.RingSize)
	}
	st.Tokens, st.Checkpoints = ss.Tokens, ss.Checkpoints
	st.LastCheckpointAgeS = -1
	if !ss.LastCheckpoint.IsZero() {
		st.LastCheckpointAgeS = now.Sub(ss.LastCheckpoint).Seconds()
	}
	// Keep the newest sample older than the window (the base) and everything after it.
	keep := 0
	for i, s := range r.samples {
		if now.Sub(s.at) >= rateWindow {
			keep = i
		}
	}
	r.samples = r.samples[keep:]
	base := r.samples[0]
	if dt := now.Sub(base.at).Seconds(); dt > 0.001 {
		st.InMBps = float64(ss.BytesIn-min(base.in, ss.BytesIn)) / dt / 1e6
		st.OutMBps = float64(ss.BytesOut-min(base.out, ss.BytesOut)) / dt / 1e6
		st.RateWindowS = dt
	}
	if len(r.samples) < 64 {
		r.samples = append(r.samples, rateSample{at: now, in: ss.BytesIn, out: ss.BytesOut})
	}
}
