package stream

// DropMeta is the meta object of a DROP packet (STREAM_FORMAT.md 3): a reader needs to know
// why a tensor is missing to tell a full ring from a client that gave up.
type DropMeta struct {
	// Reason is why the client could not place the tensor ("ring_full" when unsaid).
	Reason string `json:"reason"`
}

// DefaultDropReason is the reason written when the client gave none: the only cause the
// client has today is a full ring under policy drop.
const DefaultDropReason = "ring_full"

// TokenMeta is the meta object of a TOKEN packet (STREAM_FORMAT.md 3). The field order is
// the documented key order, so the bytes match what readers in other languages expect.
type TokenMeta struct {
	// Position is the token's sequence position (the token index when the client sent none).
	Position int64 `json:"position"`
	// Text is the decoded token.
	Text string `json:"text"`
	// TokenID is the tokenizer's id.
	TokenID int64 `json:"token_id"`
}
