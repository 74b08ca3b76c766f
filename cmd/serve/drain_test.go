package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/internal/testctx"
	"github.com/megamoe/megamoe/models"
)

// childArgsEnv makes the test binary run main() with these arguments, so the
// drain test exercises the real signal handling in a process of its own.
const childArgsEnv = "MEGAMOE_SERVE_TEST_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(childArgsEnv); ok {
		os.Args = append(os.Args[:1], strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSignalDrain starts the server, opens a long stream, signals the
// process mid-stream and checks: new connections are refused while the stream
// is still being served, the stream completes with every token and [DONE],
// and the process then exits 0.
func TestSignalDrain(t *testing.T) {
	dir, err := models.ExtractSmall()
	if err != nil {
		t.Skipf("embedded model unavailable: %v", err)
	}
	cfg, err := checkpoint.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) { testDrain(t, sig, cfg.EOS) })
	}
}

var listenRE = regexp.MustCompile(`msg=listening addr=(\S+)`)

func testDrain(t *testing.T, sig syscall.Signal, eos int) {
	cmd := exec.Command(os.Args[0])
	// A 3-token step budget: the 4-token prompt prefills in two chunks.
	cmd.Env = append(os.Environ(), childArgsEnv+"=--host 127.0.0.1 --port 0 --max-model-len 512 --kv-cache-memory 67108864 --max-num-seqs 2 --max-num-batched-tokens 3")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	ctx := testctx.New(t)
	var log []string // the server's stderr so far
	waitLog := func(what string, match func(string) bool) string {
		t.Helper()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("server exited before %s:\n%s", what, strings.Join(log, "\n"))
				}
				log = append(log, l)
				if match(l) {
					return l
				}
			case <-ctx.Done():
				t.Fatalf("no %s: %v:\n%s", what, context.Cause(ctx), strings.Join(log, "\n"))
			}
		}
	}
	addr := listenRE.FindStringSubmatch(waitLog("listening line", listenRE.MatchString))[1]

	// EOS is biased away so that the stream runs its full length.
	const maxTokens = 200
	body := fmt.Sprintf(`{"prompt":[0,5,9,12],"max_tokens":%d,"temperature":0,"stream":true,"stream_options":{"include_usage":true},"logit_bias":{"%d":-100}}`, maxTokens, eos)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // the first chunk arrived: the stream is on
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	waitLog("drain message", func(l string) bool { return strings.Contains(l, "draining in-flight requests") })
	for _, l := range log {
		if strings.Contains(l, "path=/v1/completions") {
			t.Fatalf("the stream finished before the signal; make it longer:\n%s", strings.Join(log, "\n"))
		}
	}
	if accepts(addr) {
		t.Errorf("a new connection was accepted while draining")
	}
	t0 := time.Now()

	var events []string
	for {
		line, err := br.ReadString('\n')
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "data: ") {
			events = append(events, strings.TrimPrefix(line, "data: "))
		}
		if err != nil {
			break
		}
	}
	t.Logf("rest of stream took %v", time.Since(t0))
	if len(events) < 2 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream cut: last events %q", events[max(0, len(events)-3):])
	}
	var last struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.Unmarshal([]byte(events[len(events)-2]), &last); err != nil || last.Usage.CompletionTokens != maxTokens {
		t.Errorf("usage event %s (%v), want %d completion tokens", events[len(events)-2], err, maxTokens)
	}

	for open := true; open; { // the rest of stderr, until the process ends
		select {
		case l, ok := <-lines:
			log, open = append(log, l), ok
		case <-ctx.Done():
			t.Fatalf("server did not exit after draining: %v:\n%s", context.Cause(ctx), strings.Join(log, "\n"))
		}
	}
	err = <-exited
	exited <- err // for the cleanup
	if err != nil || !strings.Contains(strings.Join(log, "\n"), "msg=drained") {
		t.Errorf("server exit: %v, want status 0 after \"drained\":\n%s", err, strings.Join(log, "\n"))
	}
	if accepts(addr) {
		t.Errorf("a connection was accepted after exit")
	}
}

// accepts reports whether something accepts a TCP connection at addr. A
// loopback connection to itself (the kernel picked addr's port as the source
// port, possible once nothing listens there) does not count.
func accepts(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	return c.LocalAddr().String() != c.RemoteAddr().String()
}
