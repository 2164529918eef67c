//go:build !amd64 || purego

package codec

// The vector transposes exist for amd64 only; elsewhere the word-wide loops do it all.

var hasAVX2 = false

func shuffle4Vec(_, _, _, _, _ []byte, _ bool) int { return 0 }

func shuffle2Vec(_, _, _ []byte, _ bool) int { return 0 }
