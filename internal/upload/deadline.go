package upload

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// ErrNoAnswer is an S3 call the server did not answer within its deadline (callTimeout):
// a server that hangs (stopped, a network black hole) fails the attempt like one that
// refuses, and the upload retries it.
var ErrNoAnswer = errors.New("no answer from the server")

// callTimeout is the deadline of a call moving n bytes: the floor, plus n at the slowest
// rate still taken for a live transfer.
func (c *Client) callTimeout(n int64) time.Duration {
	return c.floor + time.Duration(float64(n)/float64(c.rate)*float64(time.Second))
}

// StallAfter is how long an upload may wait for an answer from the server before status
// shows it stalled: the calls' floor (ClientOptions.Timeout).
func (c *Client) StallAfter() time.Duration { return c.floor }

// call bounds one S3 call moving n bytes by its deadline and reports it to the upload's
// answer tracker (carried by ctx, if any). The returned end takes the call's error: a
// deadline reached becomes ErrNoAnswer, naming the call and its deadline.
func (c *Client) call(ctx context.Context, op string, n int64) (context.Context, func(*error)) {
	return c.callWithin(ctx, op, c.callTimeout(n), n)
}

// callWithin is call with the deadline d.
func (c *Client) callWithin(ctx context.Context, op string, d time.Duration, n int64) (context.Context, func(*error)) {
	cctx, cancel := context.WithTimeout(ctx, d)
	tr := trackerOf(ctx)
	tr.start()
	return cctx, func(errp *error) {
		err := *errp
		if err != nil && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
			*errp = fmt.Errorf("%s: %w within %s (its deadline: %s + %d bytes at %d B/s)", op, ErrNoAnswer,
				d.Round(time.Millisecond), c.floor, n, c.rate)
		}
		cancel()
		tr.end(answered(*errp))
	}
}

// answered reports whether a call's outcome came from the server (a success or its error
// answer) rather than from no answer at all (a deadline, a connection refused or reset).
func answered(err error) bool {
	if err == nil || apiCode(err) != "" {
		return true
	}
	var re *smithyhttp.ResponseError
	return errors.As(err, &re) && !errors.Is(err, ErrNoAnswer)
}

// tracker follows one upload's calls: since when it has been waiting for an answer from
// the server. An unanswered call keeps the wait going (through the backoff after it) until
// some call is answered.
type tracker struct {
	mu       sync.Mutex
	inflight int
	waiting  bool
	since    time.Time
}

type trackerKey struct{}

// withTracker is ctx carrying t: every call made with it is tracked.
func withTracker(ctx context.Context, t *tracker) context.Context {
	return context.WithValue(ctx, trackerKey{}, t)
}

func trackerOf(ctx context.Context) *tracker {
	t, _ := ctx.Value(trackerKey{}).(*tracker)
	return t
}

func (t *tracker) start() {
	if t == nil {
		return
	}
	t.mu.Lock()
	if !t.waiting {
		t.waiting, t.since = true, time.Now()
	}
	t.inflight++
	t.mu.Unlock()
}

func (t *tracker) end(answered bool) {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.inflight--
	if answered {
		// An answer: the server is alive; calls still in flight wait from now.
		t.since = time.Now()
		t.waiting = t.inflight > 0
	}
	t.mu.Unlock()
}

// waitingFor is how long the upload has been waiting for an answer (0: not waiting).
func (t *tracker) waitingFor() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.waiting {
		return 0
	}
	return time.Since(t.since)
}
