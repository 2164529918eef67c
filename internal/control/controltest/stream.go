package controltest

import (
	"errors"
	"os"
	"time"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/shm"
)

// Stream drives one session with a shm.Producer the way the Python client does: split,
// place, publish, and under policy block wait for RELEASE, under policy drop send DROP.
type Stream struct {
	C      *control.Client
	P      *shm.Producer
	Policy string
	// Drops counts DROP notices sent.
	Drops uint64
	// publishedSeq is the last tensor sequence number placed (for PUBLISH).
	lastTensorSeq uint64
	published     uint64
}

// ErrDropped reports that Put dropped (part of) a tensor under policy drop.
var ErrDropped = errors.New("dropped")

// OpenStream creates a producer ring of ringSize bytes, opens a session writing to out and
// returns the stream.
func OpenStream(c *control.Client, ringSize uint64, out *os.File, req control.Open) (*Stream, control.Opened, error) {
	return OpenStreamResources(c, ringSize, out, nil, req)
}

// OpenStreamResources is OpenStream with a resource log res (a file open for writing;
// nil: none), for sessions that send RESOURCES.
func OpenStreamResources(c *control.Client, ringSize uint64, out, res *os.File, req control.Open) (*Stream, control.Opened, error) {
	p, err := shm.NewProducer(ringSize, shm.ProducerOptions{})
	if err != nil {
		return nil, control.Opened{}, err
	}
	req.RingSize = ringSize
	var o control.Opened
	if res != nil {
		o, err = c.OpenResources(p.File(), out, res, req)
	} else {
		o, err = c.Open(p.File(), out, req)
	}
	if err != nil {
		p.Close()
		return nil, o, err
	}
	return &Stream{C: c, P: p, Policy: req.Policy}, o, nil
}

// Put places t (in parts when it is large) and publishes it. Under policy drop a part that
// does not fit is reported with DROP and Put returns ErrDropped after trying every part.
func (s *Stream) Put(t *shm.Tensor) error {
	dropped := false
	for _, part := range s.P.Split(t) {
		for !s.P.Fits(&part) {
			if s.published < s.P.Head() {
				if err := s.publish(); err != nil {
					return err
				}
			}
			if s.Policy == "drop" {
				break
			}
			if _, err := s.C.WaitRelease(s.P.Tail()); err != nil {
				return err
			}
			if err := s.P.Release(s.C.Tail); err != nil {
				return err
			}
		}
		if !s.P.Fits(&part) {
			seq := s.P.TakeSeq()
			s.Drops++
			dropped = true
			if err := s.C.Drop(control.Drop{Seq: seq, Name: part.Name, Step: part.Step, Forward: part.Forward,
				Bytes: uint64(len(part.Payload)), Reason: "ring_full"}); err != nil {
				return err
			}
			continue
		}
		seq, err := s.P.Put(&part)
		if err != nil {
			return err
		}
		s.lastTensorSeq = seq
	}
	if err := s.publish(); err != nil {
		return err
	}
	if dropped {
		return ErrDropped
	}
	return nil
}

// Absorb takes every RELEASE already queued on the socket without blocking.
func (s *Stream) Absorb() error {
	_ = s.C.Conn().Unix().SetReadDeadline(time.Now())
	defer s.C.Conn().Unix().SetReadDeadline(time.Time{})
	for {
		_, err := s.C.Recv()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return s.P.Release(s.C.Tail)
			}
			return err
		}
	}
}

func (s *Stream) publish() error {
	if s.published == s.P.Head() {
		return nil
	}
	if err := s.C.Publish(s.P.Head(), s.lastTensorSeq); err != nil {
		return err
	}
	s.published = s.P.Head()
	if s.Policy == "drop" {
		return s.Absorb()
	}
	return nil
}

// Finish sends CLOSE and waits for CLOSED, then releases the producer.
func (s *Stream) Finish() (control.Closed, error) {
	cl, err := s.C.Close(control.Close{Seq: s.P.LastSeq(), Head: s.P.Head(), Drops: s.Drops})
	return cl, errors.Join(err, s.P.Close())
}
