package api

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// connKey is the context key of a client connection's state (ConnContext).
type connKey struct{}

// connState counts one client connection's requests that wait for their
// first token.
type connState struct{ waiting atomic.Int64 }

// ConnContext is meant for http.Server.ConnContext: it gives each client
// connection the count that Config.MaxQueuedPerConn bounds. Without it the
// bound does not apply.
func ConnContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, &connState{})
}

// queueSlot is one request's place in its connection's count, given back
// once each of its choices has produced something (or the request ended).
type queueSlot struct {
	conn *connState
	left atomic.Int64 // choices still waiting
	once sync.Once
}

// takeSlot counts a request of n choices against its connection's bound: a
// 429 when the connection already has MaxQueuedPerConn requests waiting; nil
// (nothing to give back) when no bound applies.
func (s *Server) takeSlot(ctx context.Context, n int) (*queueSlot, error) {
	lim := int64(s.cfg.MaxQueuedPerConn)
	cs, _ := ctx.Value(connKey{}).(*connState)
	if lim <= 0 || cs == nil {
		return nil, nil
	}
	if cs.waiting.Add(1) > lim {
		cs.waiting.Add(-1)
		return nil, errorf(http.StatusTooManyRequests, "", "too_many_queued_requests",
			"this connection already has %d requests waiting for their first token; retry later", lim)
	}
	q := &queueSlot{conn: cs}
	q.left.Store(int64(n))
	return q, nil
}

// started marks one choice as having produced its first event.
func (q *queueSlot) started() {
	if q != nil && q.left.Add(-1) == 0 {
		q.release()
	}
}

// release gives the slot back (once).
func (q *queueSlot) release() {
	if q != nil {
		q.once.Do(func() { q.conn.waiting.Add(-1) })
	}
}
