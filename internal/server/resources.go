package server

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"go.uber.org/zap"

	"github.com/strap-llm/strap/internal/control"
)

// resourceLog is a session's resource log: the file the client passed with OPEN
// ("resources": true), into which the events of RESOURCES messages are appended as JSON
// lines. A failed write ends the log, never the capture: it is logged once, later events
// are counted as lost, and status shows both.
type resourceLog struct {
	mu     sync.Mutex
	f      *os.File
	log    *zap.Logger
	events uint64
	lost   uint64
	err    error
}

// checkResourceLog validates the resource log descriptor: a regular file open for writing.
func checkResourceLog(fd int) error {
	_, err := checkWritableFile(fd, "resource log", "open it O_WRONLY|O_CREAT|O_TRUNC")
	return err
}

func newResourceLog(fd int, id uint64, log *zap.Logger) *resourceLog {
	return &resourceLog{f: os.NewFile(uintptr(fd), fmt.Sprintf("session-%d-resources", id)), log: log}
}

// append writes n events (JSON lines) with one write.
func (r *resourceLog) append(lines []byte, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		r.lost += uint64(n)
		return
	}
	if _, err := r.f.Write(lines); err != nil {
		r.err = err
		r.lost += uint64(n)
		r.log.Warn("resource log write failed; later resource events are lost", zap.Error(err))
		return
	}
	r.events += uint64(n)
}

// fill puts the log's counts into a session's status.
func (r *resourceLog) fill(st *control.SessionStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st.ResourceEvents, st.ResourceEventsLost = r.events, r.lost
	if r.err != nil {
		st.ResourceLogError = r.err.Error()
	}
}

// close makes the log durable and closes it; a write error seen earlier is returned too.
func (r *resourceLog) close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	serr := r.f.Sync()
	return errors.Join(r.err, serr, r.f.Close())
}
