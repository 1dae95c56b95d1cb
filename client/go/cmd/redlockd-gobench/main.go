// Command redlockd-gobench is scripts/bench's Go client load: --conns
// goroutines share one Client (one session, one connection, tagged
// requests), each with a resource of its own, looping Lock (ttl 30 s) +
// Unlock for --duration seconds. One cycle is one LOCK+UNLOCK. It prints
// one JSON object with the fields redlockd-bench and bench/node print, so
// that scripts/bench reads every row the same way.
//
//	redlockd-gobench --server 127.0.0.1:7390 --duration 10 --conns 50 \
//	    [--clients 1] [--watch daemon=PID]...
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	redlockd "github.com/redlockd/redlockd/client/go"
)

type watch struct {
	name string
	pid  int
}

type watchList []watch

func (w *watchList) String() string { return fmt.Sprint(*w) }

func (w *watchList) Set(v string) error {
	name, pid, ok := strings.Cut(v, "=")
	n, err := strconv.Atoi(pid)
	if !ok || name == "" || err != nil {
		return errors.New("want NAME=PID")
	}
	*w = append(*w, watch{name, n})
	return nil
}

var clkTck = func() float64 {
	if v, err := strconv.ParseFloat(os.Getenv("CLK_TCK"), 64); err == nil && v > 0 {
		return v
	}
	return 100
}()

// procCPU: utime+stime of pid in seconds, or -1.
func procCPU(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return -1
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	k, _ := strconv.ParseFloat(f[12], 64)
	return (u + k) / clkTck
}

func selfCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func percentiles(ms []float64) map[string]float64 {
	sort.Float64s(ms)
	n := len(ms)
	at := func(p float64) float64 {
		if n == 0 {
			return 0
		}
		i := int(p/100*float64(n)+0.999999) - 1
		if i < 0 {
			i = 0
		}
		if i >= n {
			i = n - 1
		}
		return ms[i]
	}
	sum := 0.0
	for _, v := range ms {
		sum += v
	}
	mean, max := 0.0, 0.0
	if n > 0 {
		mean, max = sum/float64(n), ms[n-1]
	}
	return map[string]float64{"count": float64(n), "mean": mean, "p50": at(50),
		"p90": at(90), "p99": at(99), "p999": at(99.9), "max": max}
}

func main() {
	server := flag.String("server", "127.0.0.1:7390", "daemon address (comma-separated for several)")
	conns := flag.Int("conns", 50, "goroutines")
	clients := flag.Int("clients", 1, "Clients (sessions) the goroutines are spread over")
	duration := flag.Float64("duration", 10, "seconds")
	prefix := flag.String("prefix", fmt.Sprintf("go:%d", os.Getpid()), "resource name prefix")
	ttl := flag.Int("ttl", 30000, "lease ttl, ms")
	var watches watchList
	flag.Var(&watches, "watch", "NAME=PID: a process whose CPU time to report (repeatable)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the window to this file")
	flag.Parse()
	if *conns < 1 || *clients < 1 || *duration <= 0 {
		flag.Usage()
		os.Exit(2)
	}

	ctx := context.Background()
	cs := make([]*redlockd.Client, *clients)
	for i := range cs {
		c, err := redlockd.Dial(ctx, redlockd.Config{
			Servers: strings.Split(*server, ","), Name: fmt.Sprintf("gobench-%d", i)})
		if err != nil {
			fmt.Fprintln(os.Stderr, "redlockd-gobench:", err)
			os.Exit(1)
		}
		defer c.Close()
		cs[i] = c
	}
	opts := []redlockd.Option{redlockd.TTL(time.Duration(*ttl) * time.Millisecond)}
	names := make([]string, *conns)
	for w := range names {
		names[w] = fmt.Sprintf("%s:%d", *prefix, w)
		// A warm-up cycle per goroutine before the window.
		l, err := cs[w%len(cs)].Lock(ctx, names[w], opts...)
		if err == nil {
			err = l.Unlock(ctx)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "redlockd-gobench: warm-up:", err)
			os.Exit(1)
		}
	}

	var stop atomic.Bool
	var cycles atomic.Int64
	var mu sync.Mutex
	errs := map[string]int{}
	total := 0
	lats := make([][]float64, *conns)
	w0 := make([]float64, len(watches))
	for i, w := range watches {
		w0[i] = procCPU(w.pid)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "redlockd-gobench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	self0 := selfCPU()
	t0 := time.Now()
	timer := time.AfterFunc(time.Duration(*duration*float64(time.Second)), func() { stop.Store(true) })
	var wg sync.WaitGroup
	for w := range names {
		w := w
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cs[w%len(cs)]
			lat := make([]float64, 0, 1<<14)
			fail := func(err error) {
				code := "other"
				var rerr *redlockd.Error
				if errors.As(err, &rerr) {
					code = rerr.Code
				}
				mu.Lock()
				if total < 3 {
					fmt.Fprintf(os.Stderr, "%s: %v\n", code, err)
				}
				total++
				errs[code]++
				mu.Unlock()
			}
			for !stop.Load() {
				a := time.Now()
				l, err := c.Lock(ctx, names[w], opts...)
				if err != nil {
					fail(err)
					continue
				}
				lat = append(lat, float64(time.Since(a).Nanoseconds())/1e6)
				if err := l.Unlock(ctx); err != nil {
					fail(err)
					continue
				}
				cycles.Add(1)
			}
			lats[w] = lat
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0).Seconds()
	timer.Stop()
	cpu := map[string]float64{}
	for i, w := range watches {
		if v := procCPU(w.pid); v >= 0 && w0[i] >= 0 {
			cpu[w.name] = v - w0[i]
		}
	}
	cpu["client"] = selfCPU() - self0
	n := cycles.Load()
	per := map[string]float64{}
	for k, v := range cpu {
		if n > 0 {
			per[k] = v * 1e6 / float64(n)
		}
	}
	var all []float64
	for _, l := range lats {
		all = append(all, l...)
	}
	errOut := map[string]int{"total": total}
	for k, v := range errs {
		errOut[k] = v
	}
	out := map[string]interface{}{
		"mode": "go-client", "connections": *conns, "clients": *clients,
		"elapsed_s": elapsed, "cycles": n, "cycles_per_s": float64(n) / elapsed,
		"ttl_ms": *ttl, "latency_ms": map[string]interface{}{"lock": percentiles(all)},
		"errors": errOut, "complete": n > 0, "cpu_s": cpu, "cpu_us_per_cycle": per,
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}
