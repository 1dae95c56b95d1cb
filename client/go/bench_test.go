package redlockd

import (
	"strconv"
	"sync/atomic"
	"testing"
)

// BenchmarkLockUnlock: one LOCK+UNLOCK cycle per op, goroutines of one
// Client each on a resource of its own (go test -bench . -benchmem; the
// -cpu flag sets the goroutines per CPU with -test.parallelism... see
// b.SetParallelism).
func BenchmarkLockUnlock(b *testing.B) {
	c := dial(b, Config{})
	var n atomic.Int64
	b.SetParallelism(25) // 50 goroutines on 2 CPUs
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := res(b, "r") + strconv.FormatInt(n.Add(1), 10)
		for pb.Next() {
			l, err := c.Lock(bg(), r)
			if err != nil {
				b.Error(err)
				return
			}
			if err := l.Unlock(bg()); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
