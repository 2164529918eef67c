package codec

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"

	"github.com/strap-llm/strap/internal/dtype"
)

// RawBit marks a block-table entry whose block is stored uncompressed.
const RawBit = 1 << 31

const (
	// parallelDecodeMin is the payload size from which DecodePayload spreads blocks over cores.
	parallelDecodeMin = 4 << 20
	// maxUpfrontRatio is the raw/stored ratio up to which DecodePayload trusts raw_len
	// enough to allocate it before decoding.
	maxUpfrontRatio = 64
)

// TableEntry is one parsed block-table entry.
type TableEntry struct {
	// Off is the block's offset within the payload (after the table).
	Off int
	// Stored is the block's size on disk.
	Stored int
	// RawLen is the size the block decodes to.
	RawLen int
	// Raw reports the block is stored verbatim.
	Raw bool
}

// BlockCount is the number of blocks a payload of rawLen bytes is cut into.
func BlockCount(rawLen, blockSize int) int {
	if rawLen <= 0 || blockSize <= 0 {
		return 0
	}
	return (rawLen + blockSize - 1) / blockSize
}

// TableLen is the size of the block table for n blocks.
func TableLen(n int) int { return 4 + 4*n }

// AppendBlockTable appends the block table for blocks of the given stored sizes; raw[i]
// marks block i as stored verbatim. raw may be nil (no raw blocks).
func AppendBlockTable(dst []byte, sizes []int, raw []bool) ([]byte, error) {
	if raw != nil && len(raw) != len(sizes) {
		return dst, fmt.Errorf("block table: %d sizes, %d raw flags: %w", len(sizes), len(raw), ErrBlockTable)
	}
	if uint64(len(sizes)) > 1<<32-1 {
		return dst, fmt.Errorf("block table: %d blocks: %w", len(sizes), ErrBlockTable)
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(sizes)))
	for i, s := range sizes {
		if s < 0 || uint64(s) >= RawBit {
			return dst, fmt.Errorf("block table: block %d size %d: %w", i, s, ErrBlockTable)
		}
		v := uint32(s)
		if raw != nil && raw[i] {
			v |= RawBit
		}
		dst = binary.LittleEndian.AppendUint32(dst, v)
	}
	return dst, nil
}

// ParseBlockTable checks the block table at the start of payload strictly against the
// packet's raw_len and block_size: the block count, every size, the raw bit (a raw block
// stores exactly its decoded size) and that the blocks fill the payload to its end.
func ParseBlockTable(payload []byte, rawLen, blockSize int) ([]TableEntry, error) {
	if rawLen < 0 {
		return nil, fmt.Errorf("block table: raw_len %d: %w", rawLen, ErrBlockTable)
	}
	if blockSize <= 0 || blockSize > MaxBlockSize {
		return nil, fmt.Errorf("block table: block_size %d not in 1..%d: %w", blockSize, MaxBlockSize, ErrBlockTable)
	}
	if len(payload) < 4 {
		return nil, fmt.Errorf("block table: payload of %d bytes: %w", len(payload), ErrBlockTable)
	}
	n := int(binary.LittleEndian.Uint32(payload))
	want := BlockCount(rawLen, blockSize)
	if n != want {
		return nil, fmt.Errorf("block table: %d blocks, raw_len %d at block_size %d needs %d: %w",
			n, rawLen, blockSize, want, ErrBlockTable)
	}
	if (len(payload)-4)/4 < n {
		return nil, fmt.Errorf("block table: %d entries do not fit in %d bytes: %w", n, len(payload), ErrBlockTable)
	}
	off := TableLen(n)
	entries := make([]TableEntry, n)
	for i := range entries {
		v := binary.LittleEndian.Uint32(payload[4+4*i:])
		e := TableEntry{Off: off, Stored: int(v &^ RawBit), Raw: v&RawBit != 0}
		e.RawLen = min(blockSize, rawLen-i*blockSize)
		if e.Raw && e.Stored != e.RawLen {
			return nil, fmt.Errorf("block table: raw block %d stores %d bytes, decodes to %d: %w",
				i, e.Stored, e.RawLen, ErrBlockTable)
		}
		if e.Stored > len(payload)-off {
			return nil, fmt.Errorf("block table: block %d (%d bytes at %d) past payload end %d: %w",
				i, e.Stored, off, len(payload), ErrBlockTable)
		}
		off += e.Stored
		entries[i] = e
	}
	if off != len(payload) {
		return nil, fmt.Errorf("block table: blocks end at %d, payload at %d: %w", off, len(payload), ErrBlockTable)
	}
	return entries, nil
}

// EncodePayload cuts raw into blocks of blockSize, encodes them one after another and
// returns the stored payload (block table then blocks). For codec none it returns raw.
// The daemon compresses blocks in parallel itself; this is the simple form for tools/tests.
func EncodePayload(c Codec, dt dtype.DType, raw []byte, blockSize int) ([]byte, error) {
	if c.ID() == None {
		return raw, nil
	}
	if blockSize <= 0 || blockSize > MaxBlockSize {
		return nil, fmt.Errorf("encode: block_size %d not in 1..%d: %w", blockSize, MaxBlockSize, ErrBlockTable)
	}
	n := BlockCount(len(raw), blockSize)
	sizes := make([]int, n)
	rawFlags := make([]bool, n)
	var body []byte
	for i := range n {
		blk := raw[i*blockSize : min(len(raw), (i+1)*blockSize)]
		l := len(body)
		out, ok, err := c.Encode(body, blk, dt)
		if err != nil {
			return nil, fmt.Errorf("encode block %d: %w", i, err)
		}
		if !ok {
			out = append(out[:l], blk...)
		}
		body = out
		sizes[i] = len(body) - l
		rawFlags[i] = !ok
	}
	tbl, err := AppendBlockTable(make([]byte, 0, TableLen(n)+len(body)), sizes, rawFlags)
	if err != nil {
		return nil, err
	}
	return append(tbl, body...), nil
}

// DecodePayload validates a stored payload against raw_len and block_size and decodes it.
// For codec none the payload is returned as is (stored_len must equal raw_len). Large
// payloads are decoded on all cores, one block per task.
func DecodePayload(c Codec, dt dtype.DType, payload []byte, rawLen, blockSize int) ([]byte, error) {
	if c.ID() == None {
		if len(payload) != rawLen {
			return nil, fmt.Errorf("none: %d stored bytes for raw_len %d: %w", len(payload), rawLen, ErrCorrupt)
		}
		if blockSize != 0 {
			return nil, fmt.Errorf("none: block_size %d, want 0: %w", blockSize, ErrBlockTable)
		}
		return payload, nil
	}
	entries, err := ParseBlockTable(payload, rawLen, blockSize)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Name(), err)
	}
	bnd, _ := c.(Bounder)
	if bnd != nil {
		for i, e := range entries {
			if !e.Raw && e.RawLen > bnd.MaxDecodedLen(e.Stored) {
				return nil, fmt.Errorf("%s: block %d of %d bytes cannot decode to %d: %w",
					c.Name(), i, e.Stored, e.RawLen, ErrCorrupt)
			}
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(entries))
	// A payload claiming more than an honest ratio is decoded one block after another into
	// a buffer that grows with the bytes really produced, so a lie costs no allocation.
	if rawLen > maxUpfrontRatio*len(payload) || rawLen < parallelDecodeMin || workers < 2 {
		out := make([]byte, 0, min(rawLen, maxUpfrontRatio*len(payload)))
		for i, e := range entries {
			src := payload[e.Off : e.Off+e.Stored]
			if e.Raw {
				out = append(out, src...)
				continue
			}
			l := len(out)
			if out, err = c.Decode(out, src, dt, e.RawLen); err != nil {
				return nil, fmt.Errorf("%s: block %d: %w", c.Name(), i, err)
			}
			if len(out)-l != e.RawLen {
				return nil, fmt.Errorf("%s: block %d decoded to %d bytes, want %d: %w", c.Name(), i, len(out)-l, e.RawLen, ErrCorrupt)
			}
		}
		return out, nil
	}
	out := make([]byte, rawLen)
	decodeOne := func(i int) error {
		e := entries[i]
		src := payload[e.Off : e.Off+e.Stored]
		region := out[i*blockSize : i*blockSize+e.RawLen]
		if e.Raw {
			copy(region, src)
			return nil
		}
		got, err := c.Decode(region[:0:e.RawLen], src, dt, e.RawLen)
		if err != nil {
			return fmt.Errorf("%s: block %d: %w", c.Name(), i, err)
		}
		if len(got) != e.RawLen {
			return fmt.Errorf("%s: block %d decoded to %d bytes, want %d: %w", c.Name(), i, len(got), e.RawLen, ErrCorrupt)
		}
		if &got[0] != &region[0] {
			copy(region, got) // a codec that could not decode in place
		}
		return nil
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		next     int
		firstErr error
		errBlock = len(entries)
	)
	for range workers {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				stop := firstErr != nil
				mu.Unlock()
				if stop || i >= len(entries) {
					return
				}
				if err := decodeOne(i); err != nil {
					mu.Lock()
					if i < errBlock { // report the lowest failing block, deterministically
						errBlock, firstErr = i, err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}
