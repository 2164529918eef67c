// Command rowcodec passes rows through the transform codec for bench/compression/retention.py:
// it reads n×d float32 rows cut into records (one record = one packet, one block each),
// stores them as -dtype, codes every record with the transform at -bound — with -shared on a
// basis per run fitted from the first record (refitted from a record whose whole rows the
// basis missed for more than a quarter) — decodes them and writes the decoded rows as float32.
// It prints the stored and raw bytes as JSON.
//
//	go run ./bench/compression/rowcodec -in rows.f32 -d 384 -records 320,300 -bound 0.0999 -shared -out dec.f32
package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/dtype"
)

func main() { os.Exit(run()) }

func run() int {
	in := flag.String("in", "", "float32 rows, little-endian")
	out := flag.String("out", "", "decoded rows, float32")
	d := flag.Int("d", 384, "row length")
	records := flag.String("records", "", "comma-separated rows per record (default: one record)")
	bound := flag.Float64("bound", codec.DefaultTransformBound, "per-row rel-L2 bound")
	shared := flag.Bool("shared", false, "code on a shared basis (transform mode 4)")
	dtName := flag.String("dtype", "bfloat16", "stored dtype: float32, bfloat16 or float16")
	fitRecords := flag.Int("fit-records", 1, "with -shared: fit the basis from this many first records (coded without it)")
	flag.Parse()
	if err := rowcodec(*in, *out, *d, *records, *bound, *shared, *dtName, *fitRecords); err != nil {
		fmt.Fprintln(os.Stderr, "rowcodec:", err)
		return 1
	}
	return 0
}

func rowcodec(in, out string, d int, records string, bound float64, shared bool, dtName string, fitRecords int) error {
	dt, err := dtype.Parse(dtName)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	n := len(b) / 4 / d
	counts := []int{n}
	if records != "" {
		counts = counts[:0]
		for _, s := range strings.Split(records, ",") {
			c, err := strconv.Atoi(s)
			if err != nil {
				return fmt.Errorf("records: %w", err)
			}
			counts = append(counts, c)
		}
	}
	c, err := codec.New("transform", codec.Options{Lossy: &codec.LossyBound{Mode: "transform", Value: bound}})
	if err != nil {
		return err
	}
	var sb *codec.SharedBasis
	res := struct {
		Raw, Stored, BasisBytes, Fits, Misses, Rows int
		// OOSRaw, OOSStored: records coded on a basis fitted from an earlier record.
		OOSRaw, OOSStored int
	}{}
	dec := make([]byte, 0, 4*n*d)
	row := 0
	var fitSrc []byte // the records a basis is fitted from, while they are gathered
	fitN := 0
	for _, cnt := range counts {
		if row+cnt > n {
			return fmt.Errorf("records hold %d rows, the file %d", row+cnt, n)
		}
		src := make([]byte, cnt*d*dt.Size())
		for i := range cnt * d {
			f := math.Float32frombits(binary.LittleEndian.Uint32(b[4*(row*d+i):]))
			switch dt {
			case dtype.Float32:
				binary.LittleEndian.PutUint32(src[4*i:], math.Float32bits(f))
			case dtype.BFloat16:
				binary.LittleEndian.PutUint16(src[2*i:], dtype.Float32ToBFloat16(f))
			default:
				binary.LittleEndian.PutUint16(src[2*i:], dtype.Float32ToFloat16(f))
			}
		}
		row += cnt
		oos := sb != nil
		if shared && sb == nil {
			fitSrc = append(fitSrc, src...)
			if fitN++; fitN == fitRecords {
				if sb, err = codec.FitSharedBasis(fitSrc, dt, d, bound); err != nil {
					return err
				}
				res.BasisBytes += len(sb.Packet())
				res.Fits++
				fitSrc, fitN = nil, 0
			}
		}
		tc, err := c.(codec.RowPreparer).ForRows(src, dt, d, 0)
		if err != nil {
			return err
		}
		if sb != nil {
			tc = tc.(codec.BasisUser).WithBasis(sb)
		}
		stored, ok, st, err := tc.(codec.StatsEncoder).EncodeStats(nil, src, dt)
		if err != nil {
			return err
		}
		var y []byte
		if !ok {
			stored, y = src, src
		} else if y, err = tc.Decode(nil, stored, dt, len(src)); err != nil {
			return err
		}
		res.Raw += len(src)
		res.Stored += len(stored)
		res.Misses += st.SharedMisses
		if oos {
			res.OOSRaw += len(src)
			res.OOSStored += len(stored)
		}
		res.Rows += cnt
		if shared && 4*st.SharedMisses > cnt {
			sb = nil // refit from the next record
		}
		for i := range cnt * d {
			var f float32
			switch dt {
			case dtype.Float32:
				f = math.Float32frombits(binary.LittleEndian.Uint32(y[4*i:]))
			case dtype.BFloat16:
				f = dtype.BFloat16ToFloat32(binary.LittleEndian.Uint16(y[2*i:]))
			default:
				f = float32(dtype.Float16ToFloat32(binary.LittleEndian.Uint16(y[2*i:])))
			}
			dec = binary.LittleEndian.AppendUint32(dec, math.Float32bits(f))
		}
	}
	res.Stored += res.BasisBytes
	if err := os.WriteFile(out, dec, 0o644); err != nil {
		return err
	}
	j, _ := json.Marshal(res)
	fmt.Println(string(j))
	return nil
}
