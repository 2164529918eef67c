package server

import (
	"fmt"
	"os"
	"sync"
)

// LogFile is an append-only log file that can be reopened at the same path, so logrotate
// can move it away and send SIGHUP (strapd serve --log-file). It is a zapcore.WriteSyncer.
type LogFile struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

// OpenLogFile opens (creating with mode 0640) path for appending.
func OpenLogFile(path string) (*LogFile, error) {
	l := &LogFile{path: path}
	if err := l.Reopen(); err != nil {
		return nil, err
	}
	return l, nil
}

// Reopen opens the path again and switches to it; the old file is closed once the switch
// is done, so no line is lost or split between the two.
func (l *LogFile) Reopen() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("open log file: %w", err)
	}
	l.mu.Lock()
	old := l.f
	l.f = f
	l.mu.Unlock()
	if old != nil {
		if err := old.Close(); err != nil {
			return fmt.Errorf("close old log file: %w", err)
		}
	}
	return nil
}

// Write appends one encoded log entry.
func (l *LogFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return 0, os.ErrClosed
	}
	return l.f.Write(p)
}

// Sync flushes the file to disk.
func (l *LogFile) Sync() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return os.ErrClosed
	}
	return l.f.Sync()
}

// Close closes the file; later writes fail with os.ErrClosed.
func (l *LogFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	if err != nil {
		return fmt.Errorf("close log file: %w", err)
	}
	return nil
}
