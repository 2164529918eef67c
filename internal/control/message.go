package control

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/strap-llm/strap/internal/jsontext"
)

// Framing constants (PROTOCOL.md 1.1).
const (
	// Version is the protocol version this package speaks.
	Version = 1
	// HeaderSize is the fixed message header: magic, version, type, body_len.
	HeaderSize = 12
	// MaxMessage is the largest datagram, header included.
	MaxMessage = 65536
)

var magic = [4]byte{'S', 'T', 'R', 'P'}

// Type is a message type number.
type Type uint16

// Message types (PROTOCOL.md 1.1).
const (
	TypeHello       Type = 1
	TypeWelcome     Type = 2
	TypeOpen        Type = 3
	TypeOpened      Type = 4
	TypePublish     Type = 5
	TypeRelease     Type = 6
	TypeDrop        Type = 7
	TypeClose       Type = 8
	TypeClosed      Type = 9
	TypeError       Type = 10
	TypeStatus      Type = 11
	TypeStatusReply Type = 12
	TypeToken       Type = 13
	// TypeCheckpoint asks for everything up to a seq to be durable (CHECKPOINTS.md).
	TypeCheckpoint Type = 14
	// TypeCheckpointed answers TypeCheckpoint with the durable facts.
	TypeCheckpointed Type = 15
	// TypeResources carries resource events for the session's resource log.
	TypeResources Type = 16
)

var typeNames = map[Type]string{
	TypeHello: "HELLO", TypeWelcome: "WELCOME", TypeOpen: "OPEN", TypeOpened: "OPENED",
	TypePublish: "PUBLISH", TypeRelease: "RELEASE", TypeDrop: "DROP", TypeClose: "CLOSE",
	TypeClosed: "CLOSED", TypeError: "ERROR", TypeStatus: "STATUS", TypeStatusReply: "STATUS_REPLY",
	TypeToken: "TOKEN", TypeCheckpoint: "CHECKPOINT", TypeCheckpointed: "CHECKPOINTED",
	TypeResources: "RESOURCES",
}

// String is the protocol name of t.
func (t Type) String() string {
	if n, ok := typeNames[t]; ok {
		return n
	}
	return fmt.Sprintf("type(%d)", uint16(t))
}

// Errors returned by this package.
var (
	// ErrBadMessage: a datagram is not a well-formed message (code bad_message).
	ErrBadMessage = errors.New("bad message")
	// ErrTooManyFDs: a message carried more file descriptors than expected; the extras
	// were closed.
	ErrTooManyFDs = errors.New("unexpected file descriptors")
	// ErrUnexpected: the peer sent a message type that is not valid at this point.
	ErrUnexpected = errors.New("unexpected message")
)

// Message is one decoded datagram. Body aliases the decoded buffer.
type Message struct {
	Version uint16
	Type    Type
	Body    []byte
}

// Encode frames body (marshalled to JSON; nil means {}) as a message of type t.
func Encode(t Type, body any) ([]byte, error) {
	var js []byte
	if body == nil {
		js = []byte("{}")
	} else {
		var err error
		if js, err = json.Marshal(body); err != nil {
			return nil, fmt.Errorf("encode %s: %w", t, err)
		}
	}
	return EncodeRaw(Version, t, js)
}

// EncodeRaw frames an already-encoded body with an explicit version (tests of version
// mismatch use it).
func EncodeRaw(version uint16, t Type, body []byte) ([]byte, error) {
	if HeaderSize+len(body) > MaxMessage {
		return nil, fmt.Errorf("encode %s: %w: %d bytes, at most %d", t, ErrBadMessage, HeaderSize+len(body), MaxMessage)
	}
	b := make([]byte, HeaderSize+len(body))
	copy(b, magic[:])
	binary.LittleEndian.PutUint16(b[4:], version)
	binary.LittleEndian.PutUint16(b[6:], uint16(t))
	binary.LittleEndian.PutUint32(b[8:], uint32(len(body)))
	copy(b[HeaderSize:], body)
	return b, nil
}

// DecodeHeader checks framing only: magic, length and body_len. It does not look at the
// version, so a version mismatch can be answered properly by the caller.
func DecodeHeader(b []byte) (Message, error) {
	if len(b) < HeaderSize {
		return Message{}, fmt.Errorf("%w: %d bytes, header needs %d", ErrBadMessage, len(b), HeaderSize)
	}
	if len(b) > MaxMessage {
		return Message{}, fmt.Errorf("%w: %d bytes, at most %d", ErrBadMessage, len(b), MaxMessage)
	}
	if [4]byte(b[0:4]) != magic {
		return Message{}, fmt.Errorf("%w: magic %q, expected %q", ErrBadMessage, b[0:4], magic[:])
	}
	m := Message{
		Version: binary.LittleEndian.Uint16(b[4:]),
		Type:    Type(binary.LittleEndian.Uint16(b[6:])),
	}
	n := binary.LittleEndian.Uint32(b[8:])
	if uint64(n) != uint64(len(b)-HeaderSize) {
		return Message{}, fmt.Errorf("%w: body_len %d, datagram carries %d body bytes", ErrBadMessage, n, len(b)-HeaderSize)
	}
	m.Body = b[HeaderSize:]
	return m, nil
}

// Decode checks framing and that the body is one JSON object.
func Decode(b []byte) (Message, error) {
	m, err := DecodeHeader(b)
	if err != nil {
		return m, err
	}
	if err := checkObject(m.Body); err != nil {
		return Message{}, fmt.Errorf("%w: %s body: %w", ErrBadMessage, m.Type, err)
	}
	return m, nil
}

func checkObject(body []byte) error {
	// Valid JSON (json.Valid's verdict) and valid Unicode text, in one pass: encoding/json
	// would decode invalid UTF-8 and lone surrogate escapes as U+FFFD, so a TOKEN text or a
	// module name would reach the stream other than the client sent it.
	if _, err := jsontext.Validate(body); err != nil {
		return err
	}
	if t := bytes.TrimLeft(body, " \t\r\n"); t[0] != '{' {
		return errors.New("not a JSON object")
	}
	return nil
}

// Unmarshal decodes the body into v and checks that every key in required is present.
func (m Message) Unmarshal(v any, required ...string) error {
	// Checked here too: a Message need not have come through Decode.
	if err := jsontext.Check(m.Body); err != nil {
		return fmt.Errorf("%w: %s body: %w", ErrBadMessage, m.Type, err)
	}
	if len(required) > 0 {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(m.Body, &keys); err != nil {
			return fmt.Errorf("%w: %s body: %w", ErrBadMessage, m.Type, err)
		}
		for _, k := range required {
			if v, ok := keys[k]; !ok || string(v) == "null" {
				return fmt.Errorf("%w: %s body lacks required field %q", ErrBadMessage, m.Type, k)
			}
		}
	}
	if err := json.Unmarshal(m.Body, v); err != nil {
		return fmt.Errorf("%w: %s body: %w", ErrBadMessage, m.Type, err)
	}
	return nil
}
