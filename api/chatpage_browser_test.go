package api

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// chromiumBinary returns a headless-capable Chromium, or skips: CI installs
// Debian's chromium package, elsewhere MEGAMOE_CHROMIUM may name one.
func chromiumBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("MEGAMOE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "chrome-headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium binary on PATH (apt-get install chromium, or set MEGAMOE_CHROMIUM): browser test skipped")
	return ""
}

// browser drives one headless Chromium over the DevTools protocol on a pipe
// (--remote-debugging-pipe: NUL-terminated JSON on fds 3 and 4), which lets a
// test wait for a streamed answer; --dump-dom's virtual time does not wait
// for a streaming fetch.
type browser struct {
	t       *testing.T
	w       io.Writer
	r       *bufio.Reader
	next    int
	session string
}

// openPage starts Chromium on url and attaches to its page.
func openPage(t *testing.T, url string) *browser {
	t.Helper()
	bin := chromiumBinary(t)
	toBrowser, ourWrite, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ourRead, fromBrowser, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), bin, "--headless=new", "--no-sandbox", "--disable-gpu",
		"--no-first-run", "--disable-dev-shm-usage", "--user-data-dir="+t.TempDir(),
		"--window-size=1000,700", "--remote-debugging-pipe", url)
	cmd.ExtraFiles = []*os.File{toBrowser, fromBrowser} // fds 3 and 4
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start %s: %v", bin, err)
	}
	toBrowser.Close()
	fromBrowser.Close()
	t.Cleanup(func() {
		ourWrite.Close()
		ourRead.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("chromium stderr:\n%s", stderr.String())
		}
	})
	b := &browser{t: t, w: ourWrite, r: bufio.NewReader(ourRead)}
	var targets struct {
		TargetInfos []struct{ TargetID, Type string } `json:"targetInfos"`
	}
	b.call("Target.getTargets", nil, &targets)
	for _, ti := range targets.TargetInfos {
		if ti.Type == "page" {
			var att struct{ SessionID string }
			b.call("Target.attachToTarget", map[string]any{"targetId": ti.TargetID, "flatten": true}, &att)
			b.session = att.SessionID
			var href string
			b.eval(waitLoadJS, &href)
			return b
		}
	}
	t.Fatalf("chromium opened no page: %+v", targets)
	return nil
}

// call sends one command (to the page once attached) and decodes its result.
func (b *browser) call(method string, params any, result any) {
	b.t.Helper()
	if err := b.try(method, params, result); err != nil {
		b.t.Fatal(err)
	}
}

// try is call returning the browser's error.
func (b *browser) try(method string, params any, result any) error {
	b.t.Helper()
	b.next++
	msg := map[string]any{"id": b.next, "method": method}
	if params != nil {
		msg["params"] = params
	}
	if b.session != "" {
		msg["sessionId"] = b.session
	}
	data, err := json.Marshal(msg)
	if err != nil {
		b.t.Fatal(err)
	}
	if _, err := b.w.Write(append(data, 0)); err != nil {
		b.t.Fatalf("%s: %v", method, err)
	}
	for {
		line, err := b.r.ReadBytes(0)
		if err != nil {
			b.t.Fatalf("%s: reading the reply: %v", method, err)
		}
		var reply struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(line[:len(line)-1], &reply); err != nil {
			b.t.Fatalf("%s: %v", method, err)
		}
		if reply.ID != b.next { // an event
			continue
		}
		if reply.Error != nil {
			return fmt.Errorf("%s: %s", method, reply.Error.Message)
		}
		if result != nil {
			if err := json.Unmarshal(reply.Result, result); err != nil {
				b.t.Fatalf("%s: %v", method, err)
			}
		}
		return nil
	}
}

// eval evaluates a JavaScript expression in the page, awaiting a promise,
// and decodes its JSON value into v.
func (b *browser) eval(expr string, v any) {
	b.t.Helper()
	var res struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	// The page may still be replacing about:blank: evaluate again in the new document.
	for {
		err := b.try("Runtime.evaluate", map[string]any{"expression": expr, "awaitPromise": true, "returnByValue": true}, &res)
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "context") {
			b.t.Fatal(err)
		}
	}
	if e := res.ExceptionDetails; e != nil {
		b.t.Fatalf("script: %s %s", e.Text, e.Exception.Description)
	}
	if err := json.Unmarshal(res.Result.Value, v); err != nil {
		b.t.Fatalf("script value %s: %v", res.Result.Value, err)
	}
}

// screenshot saves a PNG of the page under MEGAMOE_SCREENSHOT_DIR (or the
// test's temporary directory) and returns its path.
func (b *browser) screenshot(name string) string {
	b.t.Helper()
	var shot struct{ Data string }
	b.call("Page.captureScreenshot", map[string]any{"format": "png"}, &shot)
	png, err := base64.StdEncoding.DecodeString(shot.Data)
	if err != nil {
		b.t.Fatal(err)
	}
	dir := os.Getenv("MEGAMOE_SCREENSHOT_DIR")
	if dir == "" {
		dir = b.t.TempDir()
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	return path
}

// waitLoadJS waits until the page has replaced about:blank and loaded.
const waitLoadJS = `new Promise((resolve) => {
  const poll = () => location.href !== "about:blank" && document.readyState === "complete" ?
    resolve(location.href) : setTimeout(poll, 20);
  poll();
})`

// waitPageJS waits (polling; the test's -timeout bounds it) until the last
// assistant message has finished and returns its state, reasoning and answer
// text.
const waitPageJS = `new Promise((resolve) => {
  const poll = () => {
    const m = [...document.querySelectorAll(".msg.assistant")].pop();
    const s = m && m.dataset.state;
    if (s === "done" || s === "error" || s === "stopped") {
      const r = m.querySelector(".reasoning");
      resolve({state: s, reasoning: r.hidden ? "" : r.querySelector(".body").textContent,
        answer: m.querySelector(".answer").textContent, text: m.textContent});
    } else {
      setTimeout(poll, 50);
    }
  };
  poll();
})`

type pageResult struct {
	State, Reasoning, Answer, Text string
}

var wordRE = regexp.MustCompile(`[A-Za-z]{3,}`)

// TestChatPageBrowser loads the page from the real server on the embedded
// model, sends a prompt through ?autosend=1 and checks the streamed answer
// (and, with thinking on, the reasoning) shows as the API returns it.
func TestChatPageBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test: not in -short")
	}
	chromiumBinary(t)
	srv, _ := startServer(t, Config{ModelName: "megamoe-small"}, 0)
	for _, c := range []struct {
		name, effort, thinking string
	}{
		{"plain", "none", "0"},
		{"thinking", "high", "1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Greedy decoding: the page's stream and this request get the same tokens.
			body := fmt.Sprintf(`{"messages":[{"role":"user","content":"Hello there"}],"temperature":0,"max_tokens":24,"reasoning_effort":%q}`, c.effort)
			resp, raw := post(t, srv, "/v1/chat/completions", body, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("reference request: %d %s", resp.StatusCode, raw)
			}
			var want struct {
				Choices []struct {
					Message struct {
						Content   string `json:"content"`
						Reasoning string `json:"reasoning_content"`
					} `json:"message"`
				} `json:"choices"`
			}
			if err := json.Unmarshal(raw, &want); err != nil || len(want.Choices) != 1 {
				t.Fatalf("reference response %s: %v", raw, err)
			}
			wantMsg := want.Choices[0].Message

			b := openPage(t, srv.URL+"/?prompt=Hello%20there&autosend=1&temperature=0&max_tokens=24&thinking="+c.thinking)
			var got pageResult
			b.eval(waitPageJS, &got)
			t.Logf("screenshot: %s", b.screenshot("chatpage-"+c.name+".png"))
			if got.State != "done" {
				t.Fatalf("page ended %q: %s", got.State, got.Text)
			}
			// The answer is rendered Markdown of noisy text: its words must
			// all appear, in order.
			checkWords(t, "answer", got.Answer, wantMsg.Content)
			if c.thinking == "1" {
				if wantMsg.Reasoning == "" {
					t.Fatal("the reference request returned no reasoning")
				}
				if got.Reasoning != wantMsg.Reasoning {
					t.Errorf("reasoning block %q, want %q", got.Reasoning, wantMsg.Reasoning)
				}
			} else if got.Reasoning != "" {
				t.Errorf("reasoning shown with thinking off: %q", got.Reasoning)
			}
		})
	}
}

// TestChatPageStop stops a long answer with the stop button, then sends a
// second prompt through the form: the stopped turn stays in the
// conversation and the second request carries it.
func TestChatPageStop(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test: not in -short")
	}
	chromiumBinary(t)
	srv, _ := startServer(t, Config{}, 0)
	b := openPage(t, srv.URL+"/?prompt=Tell%20me%20a%20story&autosend=1&max_tokens=900")
	var stopped pageResult
	b.eval(`new Promise((resolve) => {
  const poll = () => {
    const m = document.querySelector(".msg.assistant");
    if (m && m.dataset.state === "streaming" && m.querySelector(".answer").textContent.length > 0) {
      document.getElementById("stop").click();
    }
    if (m && m.dataset.state !== "waiting" && m.dataset.state !== "streaming") {
      resolve({state: m.dataset.state, answer: m.querySelector(".answer").textContent, text: m.textContent});
    } else {
      setTimeout(poll, 20);
    }
  };
  poll();
})`, &stopped)
	if stopped.State != "stopped" || stopped.Answer == "" {
		t.Fatalf("after stop: state %q, text %q", stopped.State, stopped.Text)
	}
	var sendEnabled bool
	b.eval(`!document.getElementById("send").disabled && document.getElementById("stop").disabled`, &sendEnabled)
	if !sendEnabled {
		t.Error("after stop, send is disabled or stop enabled")
	}
	var second pageResult
	b.eval(`const send = window.fetch;
window.fetch = (url, opts) => {
  if (url === "/v1/chat/completions") window.sentMessages = JSON.parse(opts.body).messages;
  return send(url, opts);
};
document.getElementById("prompt").value = "And then?";
document.getElementById("max-tokens").value = "4";
document.getElementById("form").requestSubmit();
`+waitPageJS, &second)
	if second.State != "done" {
		t.Fatalf("second turn: state %q, text %q", second.State, second.Text)
	}
	var turns []string
	b.eval(`[...document.querySelectorAll(".msg")].map((m) => m.classList[1] + ":" + m.dataset.state)`, &turns)
	if want := []string{"user:undefined", "assistant:stopped", "user:undefined", "assistant:done"}; strings.Join(turns, " ") != strings.Join(want, " ") {
		t.Errorf("messages %v, want %v", turns, want)
	}
	var sent []struct{ Role, Content string }
	b.eval(`window.sentMessages`, &sent)
	if len(sent) != 3 || sent[0] != (struct{ Role, Content string }{"user", "Tell me a story"}) ||
		sent[1].Role != "assistant" || sent[2] != (struct{ Role, Content string }{"user", "And then?"}) {
		t.Fatalf("second request sent %+v, want the first prompt, the stopped answer and the second prompt", sent)
	}
	// The page shows the stopped answer rendered as Markdown: compare words.
	checkWords(t, "stopped answer", stopped.Answer, sent[1].Content)
}

func checkWords(t *testing.T, what, got, want string) {
	t.Helper()
	words := wordRE.FindAllString(want, -1)
	if strings.TrimSpace(want) != "" && len(words) == 0 {
		t.Logf("%s has no words to compare: %q", what, want)
	}
	rest := got
	for _, w := range words {
		i := strings.Index(rest, w)
		if i < 0 {
			t.Fatalf("%s: word %q of %q missing from the page's %q", what, w, want, got)
		}
		rest = rest[i+len(w):]
	}
}

// TestChatPageMarkdown runs the page's Markdown renderer in Chromium on a
// table of inputs and compares the DOM it builds; model text that spells
// HTML must stay text and only http(s) links may become links.
func TestChatPageMarkdown(t *testing.T) {
	chromiumBinary(t)
	script, err := inlineBlock(chatPageHTML, "script")
	if err != nil {
		t.Fatal(err)
	}
	page := filepath.Join(t.TempDir(), "markdown.html")
	html := "<!DOCTYPE html><html><head><meta charset=\"utf-8\"></head><body><script>" + string(script) + "</script></body></html>"
	if err := os.WriteFile(page, []byte(html), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, md, want string }{
		{"inline", "hello **bold** and *it* and `co<de>`", "<p>hello <strong>bold</strong> and <em>it</em> and <code>co&lt;de&gt;</code></p>"},
		{"html is text", `<img src=x onerror="window.pwned=1">`, `<p>&lt;img src=x onerror="window.pwned=1"&gt;</p>`},
		{"script is text", "<script>window.pwned=1</script>", "<p>&lt;script&gt;window.pwned=1&lt;/script&gt;</p>"},
		{"links", "[ok](https://example.com/a?b=1&c=2) [bad](javascript:void0) [d](data:text/html,x)",
			`<p><a href="https://example.com/a?b=1&amp;c=2" rel="noopener noreferrer nofollow" target="_blank">ok</a> [bad](javascript:void0) [d](data:text/html,x)</p>`},
		{"link text", "[**b**](http://x.y)", `<p><a href="http://x.y/" rel="noopener noreferrer nofollow" target="_blank"><strong>b</strong></a></p>`},
		{"code block", "```js\nif (a < b) {}\n```\nafter", `<pre><code data-lang="js">if (a &lt; b) {}</code></pre><p>after</p>`},
		{"unclosed fence", "```\ncode <b>", "<pre><code>code &lt;b&gt;</code></pre>"},
		{"lists", "- one\n- **two**\n\n1. first\n2. second", "<ul><li>one</li><li><strong>two</strong></li></ul><ol><li>first</li><li>second</li></ol>"},
		{"ordered start", "3) c\n4) d", `<ol start="3"><li>c</li><li>d</li></ol>`},
		{"underscores", "snake_case_name and _it_", "<p>snake_case_name and <em>it</em></p>"},
		{"heading and paragraph", "# Title\ntext\nmore\n\nnext", "<h2>Title</h2><p>text\nmore</p><p>next</p>"},
	}
	inputs := make([]string, len(cases))
	for i, c := range cases {
		inputs[i] = c.md
	}
	js, err := json.Marshal(inputs)
	if err != nil {
		t.Fatal(err)
	}
	b := openPage(t, "file://"+page)
	var got struct {
		HTML   []string `json:"html"`
		Images int      `json:"images"`
		Pwned  bool     `json:"pwned"`
	}
	// The rendered nodes go into the document, where an <img onerror> or
	// <script> would run; the check waits a little for an image error.
	b.eval(`new Promise((resolve) => {
  const html = `+string(js)+`.map((md) => {
    const d = document.createElement("div");
    d.append(renderMarkdown(md));
    document.body.append(d);
    return d.innerHTML;
  });
  setTimeout(() => resolve({html, images: document.images.length, pwned: window.pwned === 1}), 200);
})`, &got)
	if got.Images != 0 || got.Pwned {
		t.Errorf("model text became markup: %d images, script ran: %v", got.Images, got.Pwned)
	}
	if len(got.HTML) != len(cases) {
		t.Fatalf("got %d results for %d cases", len(got.HTML), len(cases))
	}
	for i, c := range cases {
		if got.HTML[i] != c.want {
			t.Errorf("%s: %q renders as\n%s\nwant\n%s", c.name, c.md, got.HTML[i], c.want)
		}
	}
}
