// Writes small real pprof files: cpu.pprof (labels via pprof.Do), heap.pprof
// (four sample types) and mutex.pprof, using only the standard library.
package main

import (
	"context"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"time"
)

var sink [][]byte

func burn(d time.Duration) int {
	x := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		for i := 0; i < 10000; i++ {
			x += i * i
		}
	}
	return x
}

func allocate(n int) {
	for i := 0; i < n; i++ {
		sink = append(sink, make([]byte, 64<<10))
	}
}

func contend() {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				mu.Lock()
				time.Sleep(50 * time.Microsecond)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

func write(name string, p *pprof.Profile) {
	f, _ := os.Create(name)
	defer f.Close()
	p.WriteTo(f, 0)
}

func main() {
	runtime.MemProfileRate = 64 << 10
	runtime.SetMutexProfileFraction(1)
	f, _ := os.Create("cpu.pprof")
	pprof.StartCPUProfile(f)
	ctx := context.Background()
	pprof.Do(ctx, pprof.Labels("phase", "load", "worker", "a"), func(context.Context) { burn(150 * time.Millisecond) })
	pprof.Do(ctx, pprof.Labels("phase", "train", "worker", "b"), func(context.Context) { burn(250 * time.Millisecond) })
	pprof.StopCPUProfile()
	f.Close()
	allocate(64)
	runtime.GC()
	write("heap.pprof", pprof.Lookup("heap"))
	contend()
	write("mutex.pprof", pprof.Lookup("mutex"))
}
