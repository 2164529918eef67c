package control

import "fmt"

// Token sends a TOKEN notice (it must carry the session's next sequence number).
func (c *Client) Token(t Token) error { return c.conn.Send(TypeToken, t) }

// Checkpoint sends CHECKPOINT for seq (the last sequence number taken) and waits for
// CHECKPOINTED, absorbing RELEASE messages (docs/CHECKPOINTS.md 2).
func (c *Client) Checkpoint(seq uint64) (Checkpointed, error) {
	if err := c.conn.Send(TypeCheckpoint, Checkpoint{Seq: seq}); err != nil {
		return Checkpointed{}, err
	}
	m, err := c.expect(TypeCheckpointed)
	if err != nil {
		return Checkpointed{}, err
	}
	var ck Checkpointed
	if err := m.Unmarshal(&ck, "seq", "offset", "packets", "last_offset", "last_crc"); err != nil {
		return Checkpointed{}, err
	}
	if ck.Seq != seq {
		return ck, fmt.Errorf("%w: CHECKPOINTED for seq %d, asked for %d", ErrUnexpected, ck.Seq, seq)
	}
	return ck, nil
}
