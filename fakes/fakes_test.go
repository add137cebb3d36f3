package fakes_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
)

// The wire types are restated here, independently of the package, so the
// tests check the protocol itself.
type sendReply struct {
	ID       string `json:"id"`
	Replayed bool   `json:"replayed"`
}

type queryReply struct {
	Found int    `json:"found"`
	ID    string `json:"id"`
}

func start(t *testing.T, kind fakes.Kind) *fakes.Channel {
	t.Helper()
	c := fakes.Start(kind)
	t.Cleanup(c.Close)
	return c
}

// postSend sends the service's request for ref with the given client; key ""
// omits the Idempotency-Key header.
func postSend(client *http.Client, c *fakes.Channel, ref, key string) (*http.Response, error) {
	body := fmt.Sprintf(`{"ref":%q,"to":"+15550100","body":"order shipped"}`, ref)
	req, err := http.NewRequest(http.MethodPost, c.URL()+"/send", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return client.Do(req)
}

// send posts a send for ref with key ntf-<ref> and decodes a 200 answer.
func send(t *testing.T, c *fakes.Channel, ref string) (int, sendReply) {
	t.Helper()
	return sendKey(t, c, ref, "ntf-"+ref)
}

func sendKey(t *testing.T, c *fakes.Channel, ref, key string) (int, sendReply) {
	t.Helper()
	is := is.New(t)
	is.Helper()
	resp, err := postSend(http.DefaultClient, c, ref, key)
	is.NoErr(err) // send request completes
	defer resp.Body.Close()
	var reply sendReply
	if resp.StatusCode == http.StatusOK {
		is.NoErr(json.NewDecoder(resp.Body).Decode(&reply)) // 200 body is JSON
	}
	return resp.StatusCode, reply
}

func query(t *testing.T, c *fakes.Channel, ref string) (int, queryReply) {
	t.Helper()
	is := is.New(t)
	is.Helper()
	resp, err := http.Get(c.URL() + "/messages?ref=" + ref)
	is.NoErr(err) // query request completes
	defer resp.Body.Close()
	var reply queryReply
	if resp.StatusCode == http.StatusOK {
		is.NoErr(json.NewDecoder(resp.Body).Decode(&reply)) // 200 body is JSON
	}
	return resp.StatusCode, reply
}

func TestSendAcceptsOnEveryKind(t *testing.T) {
	for _, kind := range []fakes.Kind{fakes.Push, fakes.SMS, fakes.None} {
		t.Run(string(kind), func(t *testing.T) {
			is := is.New(t)
			c := start(t, kind)
			is.Equal(c.Kind(), kind) // Kind reports the contract

			status, reply := send(t, c, "task-1")
			is.Equal(status, http.StatusOK)                // accepted
			is.Equal(reply.ID, string(kind)+"-msg-0001")   // provider id from the per-server counter
			is.True(!reply.Replayed)                       // a first send is no replay
			is.Equal(c.Sends("task-1"), 1)                 // one send received
			is.Equal(c.Outbound("task-1"), 1)              // one new message
			is.Equal(c.AcceptedRefs(), []string{"task-1"}) // the ref is listed as accepted
			is.Equal(c.TotalOutbound(), 1)                 // totals agree
			is.Equal(c.Snapshot().Outbound["task-1"], 1)   // snapshot agrees
			_, second := send(t, c, "task-2")
			is.Equal(second.ID, string(kind)+"-msg-0002")            // counter moves on
			is.Equal(c.AcceptedRefs(), []string{"task-1", "task-2"}) // sorted refs
		})
	}
}

func TestPushReplaysSameIdempotencyKey(t *testing.T) {
	is := is.New(t)
	c := start(t, fakes.Push)

	_, first := send(t, c, "task-7")
	status, second := send(t, c, "task-7")
	is.Equal(status, http.StatusOK)   // a replay is still accepted
	is.True(second.Replayed)          // the second answer says replayed
	is.Equal(second.ID, first.ID)     // with the original message id
	is.Equal(c.Sends("task-7"), 2)    // both requests were received
	is.Equal(c.Outbound("task-7"), 1) // but only one message went out
	is.Equal(c.TotalOutbound(), 1)    // nothing else went out
	_, other := sendKey(t, c, "task-7", "")
	is.True(!other.Replayed)          // without a key there is no dedupe
	is.Equal(c.Outbound("task-7"), 2) // so a missing key means a new message
}

func TestSMSEveryAcceptIsNewOutboundAndQueryCounts(t *testing.T) {
	is := is.New(t)
	c := start(t, fakes.SMS)

	status, found := query(t, c, "task-3")
	is.Equal(status, http.StatusOK) // query is offered
	is.Equal(found.Found, 0)        // nothing accepted yet
	is.Equal(found.ID, "")          // so no id

	_, first := send(t, c, "task-3")
	_, second := send(t, c, "task-3")
	is.True(!second.Replayed)         // sms ignores the key
	is.True(second.ID != first.ID)    // every acceptance is a new message
	is.Equal(c.Outbound("task-3"), 2) // two messages went out

	_, found = query(t, c, "task-3")
	is.Equal(found.Found, 2)         // query reports the accepted count
	is.Equal(found.ID, first.ID)     // and the id of the first message
	is.Equal(c.Queries("task-3"), 2) // both queries counted
	is.Equal(c.TotalQueries(), 2)    // totals agree
}

func TestQueryNotOfferedOnPushAndNone(t *testing.T) {
	for _, kind := range []fakes.Kind{fakes.Push, fakes.None} {
		t.Run(string(kind), func(t *testing.T) {
			is := is.New(t)
			c := start(t, kind)
			send(t, c, "task-1")
			status, _ := query(t, c, "task-1")
			is.Equal(status, http.StatusMethodNotAllowed) // no query on this contract
			is.Equal(c.Queries("task-1"), 1)              // but the attempt is counted
		})
	}
}

func TestNoneIgnoresIdempotencyKey(t *testing.T) {
	is := is.New(t)
	c := start(t, fakes.None)
	send(t, c, "task-1")
	_, second := send(t, c, "task-1")
	is.True(!second.Replayed)         // none never replays
	is.Equal(c.Outbound("task-1"), 2) // a blind resend goes out twice
}

func TestScriptedStatusesRecordNoAcceptance(t *testing.T) {
	for _, kind := range []fakes.Kind{fakes.Push, fakes.SMS, fakes.None} {
		t.Run(string(kind), func(t *testing.T) {
			is := is.New(t)
			c := start(t, kind)
			codes := []int{503, 400, 409, 429}
			c.ScriptSend("task-1",
				fakes.Step{Status: 503, RetryAfter: "2"},
				fakes.Step{Status: 400},
				fakes.Step{Status: 409},
				fakes.Step{Status: 429, RetryAfter: "1"})
			for _, code := range codes {
				resp, err := postSend(http.DefaultClient, c, "task-1", "ntf-task-1")
				is.NoErr(err)                   // request completes
				is.Equal(resp.StatusCode, code) // scripted status answered
				if code == 503 || code == 429 {
					is.True(resp.Header.Get("Retry-After") != "") // Retry-After passed on
				}
				resp.Body.Close()
			}
			is.Equal(c.Sends("task-1"), 4)         // every request counted
			is.Equal(c.Outbound("task-1"), 0)      // none accepted
			is.Equal(c.AcceptedRefs(), []string{}) // nothing accepted at all

			status, reply := send(t, c, "task-1")
			is.Equal(status, http.StatusOK)   // queue used up: accept at once
			is.True(!reply.Replayed)          // the rejected tries left no key behind
			is.Equal(c.Outbound("task-1"), 1) // the first real acceptance
		})
	}
}

func TestScriptAllIsSharedDefault(t *testing.T) {
	is := is.New(t)
	c := start(t, fakes.SMS)
	c.ScriptAll(fakes.Step{Status: 503}, fakes.Step{Status: 503})
	c.ScriptSend("task-2", fakes.Step{Status: 409})

	status, _ := send(t, c, "task-1")
	is.Equal(status, 503) // task-1 has no queue: shared default
	status, _ = send(t, c, "task-2")
	is.Equal(status, 409) // task-2's own queue wins
	status, _ = send(t, c, "task-3")
	is.Equal(status, 503) // second shared step, consumed in order
	status, _ = send(t, c, "task-1")
	is.Equal(status, http.StatusOK) // everything used up: accept
}

func TestDelayAcceptsBeforeClientTimesOut(t *testing.T) {
	is := is.New(t)
	c := start(t, fakes.Push)
	c.ScriptSend("task-1", fakes.Step{Delay: 2 * time.Second})

	client := &http.Client{Timeout: 100 * time.Millisecond}
	began := time.Now()
	_, err := postSend(client, c, "task-1", "ntf-task-1")
	is.True(err != nil)                      // the client timed out
	is.True(time.Since(began) < time.Second) // long before the delay ended
	is.Equal(c.Outbound("task-1"), 1)        // yet the message was already accepted

	_, reply := send(t, c, "task-1")
	is.True(reply.Replayed)           // the retry with the same key is a replay
	is.Equal(c.Sends("task-1"), 2)    // two sends
	is.Equal(c.Outbound("task-1"), 1) // one message
}

func TestHangThenCloseDoesNotDeadlock(t *testing.T) {
	is := is.New(t)
	c := fakes.Start(fakes.SMS)
	c.ScriptSend("task-1", fakes.Step{Hang: true})

	errc := make(chan error, 1)
	go func() {
		resp, err := postSend(http.DefaultClient, c, "task-1", "ntf-task-1")
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	is.NoErr(c.WaitOutbound(ctx, "task-1", 1)) // accepted while the answer hangs

	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close deadlocked on a hanging handler")
	}
	select {
	case err := <-errc:
		is.True(err != nil) // the client sees a broken connection, not a 200
	case <-time.After(5 * time.Second):
		t.Fatal("client still hanging after Close")
	}
	is.Equal(c.Outbound("task-1"), 1) // the acceptance stays recorded
	c.Close()                         // Close is idempotent
}

func TestHangReleasedWhenClientGoesAway(t *testing.T) {
	is := is.New(t)
	c := start(t, fakes.Push)
	c.ScriptAll(fakes.Step{Hang: true})
	client := &http.Client{Timeout: 50 * time.Millisecond}
	_, err := postSend(client, c, "task-1", "ntf-task-1")
	is.True(err != nil)               // the client gave up
	is.Equal(c.Outbound("task-1"), 1) // after acceptance
}

func TestMalformedBody(t *testing.T) {
	is := is.New(t)
	c := start(t, fakes.Push)
	c.ScriptSend("task-1", fakes.Step{Malformed: true})

	resp, err := postSend(http.DefaultClient, c, "task-1", "ntf-task-1")
	is.NoErr(err) // request completes
	defer resp.Body.Close()
	is.Equal(resp.StatusCode, http.StatusOK) // looks like success
	body, err := io.ReadAll(resp.Body)
	is.NoErr(err)                     // body readable
	is.True(len(body) > 0)            // something came back
	is.True(!json.Valid(body))        // but it is not JSON
	is.Equal(c.Outbound("task-1"), 1) // and the message was accepted
}

func TestSlowBodyDribbles(t *testing.T) {
	is := is.New(t)
	c := start(t, fakes.SMS)
	c.ScriptSend("task-1", fakes.Step{SlowBody: 300 * time.Millisecond})

	began := time.Now()
	resp, err := postSend(http.DefaultClient, c, "task-1", "ntf-task-1")
	is.NoErr(err) // headers arrive
	defer resp.Body.Close()
	is.True(time.Since(began) < 200*time.Millisecond) // at once
	body, err := io.ReadAll(resp.Body)
	is.NoErr(err)                                      // the whole body arrives
	is.True(time.Since(began) >= 250*time.Millisecond) // but slowly
	is.True(json.Valid(body))                          // and it is valid in the end
}

func TestSlowBodyOutlastsClientTimeout(t *testing.T) {
	is := is.New(t)
	c := start(t, fakes.SMS)
	c.ScriptSend("task-1", fakes.Step{SlowBody: 2 * time.Second})

	client := &http.Client{Timeout: 150 * time.Millisecond}
	resp, err := postSend(client, c, "task-1", "ntf-task-1")
	is.NoErr(err) // headers beat the timeout
	defer resp.Body.Close()
	_, err = io.ReadAll(resp.Body)
	is.True(err != nil)               // the body does not
	is.Equal(c.Outbound("task-1"), 1) // though the message was accepted
}

func TestQueryScriptedStatus(t *testing.T) {
	is := is.New(t)
	c := start(t, fakes.SMS)
	send(t, c, "task-1")
	c.ScriptQuery("task-1", fakes.Step{Status: 503}, fakes.Step{Status: 503})

	status, _ := query(t, c, "task-1")
	is.Equal(status, http.StatusServiceUnavailable) // first scripted failure
	status, _ = query(t, c, "task-1")
	is.Equal(status, http.StatusServiceUnavailable) // second scripted failure
	status, found := query(t, c, "task-1")
	is.Equal(status, http.StatusOK)  // then the real answer
	is.Equal(found.Found, 1)         // with the accepted count
	is.Equal(c.Queries("task-1"), 3) // every query counted
	is.Equal(c.Sends("task-1"), 1)   // and queries are not sends
}

func TestBadRequestsAreNotAccepted(t *testing.T) {
	is := is.New(t)
	c := start(t, fakes.SMS)
	cases := []struct {
		name, method, path, body string
		want                     int
	}{
		{"malformed json", http.MethodPost, "/send", `{"ref":`, http.StatusBadRequest},
		{"empty ref", http.MethodPost, "/send", `{"ref":"","to":"x","body":"y"}`, http.StatusBadRequest},
		{"wrong method", http.MethodGet, "/send", ``, http.StatusMethodNotAllowed},
		{"unknown path", http.MethodPost, "/nope", `{"ref":"task-1"}`, http.StatusNotFound},
		{"query without ref", http.MethodGet, "/messages", ``, http.StatusBadRequest},
		{"query wrong method", http.MethodPost, "/messages?ref=task-1", ``, http.StatusMethodNotAllowed},
		{"body too large", http.MethodPost, "/send", `{"ref":"task-1","body":"` + strings.Repeat("x", 1<<20) + `"}`, http.StatusRequestEntityTooLarge},
	}
	for _, tc := range cases {
		req, err := http.NewRequest(tc.method, c.URL()+tc.path, strings.NewReader(tc.body))
		is.NoErr(err) // request built
		resp, err := http.DefaultClient.Do(req)
		is.NoErr(err) // request completes
		var e struct {
			Error string `json:"error"`
		}
		is.NoErr(json.NewDecoder(resp.Body).Decode(&e)) // error body is JSON
		resp.Body.Close()
		is.Equal(resp.StatusCode, tc.want) // status for this bad request
		is.True(e.Error != "")             // with a message
	}
	is.Equal(c.TotalOutbound(), 0)         // nothing accepted
	is.Equal(c.TotalSends(), 0)            // and no ref-less send counted
	is.Equal(c.AcceptedRefs(), []string{}) // no accepted refs
}

func TestWaitOutbound(t *testing.T) {
	is := is.New(t)
	c := fakes.Start(fakes.Push)

	short, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	is.True(errors.Is(c.WaitOutbound(short, "task-1", 1), context.DeadlineExceeded)) // nothing arrives in time

	waited := make(chan error, 1)
	go func() { waited <- c.WaitOutbound(context.Background(), "task-1", 2) }()
	send(t, c, "task-1")
	sendKey(t, c, "task-1", "other-key")
	is.NoErr(<-waited) // woken by the second acceptance

	go func() { waited <- c.WaitOutbound(context.Background(), "task-1", 3) }()
	c.Close()
	is.True(errors.Is(<-waited, fakes.ErrClosed)) // Close releases waiters
}

func TestStartOn(t *testing.T) {
	is := is.New(t)
	c, err := fakes.StartOn(fakes.None, "127.0.0.1:0")
	is.NoErr(err) // listens on the given address
	defer c.Close()
	is.True(strings.HasPrefix(c.URL(), "http://127.0.0.1:")) // base URL of the listener
	status, _ := send(t, c, "task-1")
	is.Equal(status, http.StatusOK) // and serves the protocol

	_, err = fakes.StartOn("fax", "127.0.0.1:0")
	is.True(err != nil) // unknown kinds are refused
	_, err = fakes.StartOn(fakes.SMS, c.URL()[len("http://"):])
	is.True(err != nil) // a busy address is an error, not a panic
}

func TestConcurrentSends(t *testing.T) {
	is := is.New(t)
	push := start(t, fakes.Push)
	sms := start(t, fakes.SMS)
	const refs, repeats = 10, 5
	var wg sync.WaitGroup
	for i := range refs {
		ref := fmt.Sprintf("task-%d", i)
		for range repeats {
			for _, c := range []*fakes.Channel{push, sms} {
				wg.Go(func() {
					resp, err := postSend(http.DefaultClient, c, ref, "ntf-"+ref)
					if err == nil {
						resp.Body.Close()
					}
				})
			}
			wg.Go(func() { _ = sms.Snapshot(); _ = push.AcceptedRefs() })
		}
	}
	wg.Wait()
	is.Equal(push.TotalSends(), refs*repeats)   // every push send counted
	is.Equal(push.TotalOutbound(), refs)        // one message per key
	is.Equal(sms.TotalOutbound(), refs*repeats) // sms: every send is a message
	is.Equal(len(push.AcceptedRefs()), refs)    // every ref accepted
	for i := range refs {
		is.Equal(push.Outbound(fmt.Sprintf("task-%d", i)), 1) // exactly once per ref
	}
}

// control is a client of ControlHandler.
type control struct {
	t   *testing.T
	url string
}

func (ctl control) do(method, path, body string) (int, []byte) {
	ctl.t.Helper()
	is := is.New(ctl.t)
	is.Helper()
	req, err := http.NewRequest(method, ctl.url+path, strings.NewReader(body))
	is.NoErr(err) // request built
	resp, err := http.DefaultClient.Do(req)
	is.NoErr(err) // control request completes
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	is.NoErr(err) // body readable
	return resp.StatusCode, out
}

func TestControlScriptAndCountsRoundTrip(t *testing.T) {
	is := is.New(t)
	push, sms, none := start(t, fakes.Push), start(t, fakes.SMS), start(t, fakes.None)
	srv := httptest.NewServer(fakes.ControlHandler(push, sms, none))
	defer srv.Close()
	ctl := control{t: t, url: srv.URL}

	status, _ := ctl.do(http.MethodPost, "/control/sms/script",
		`{"ref":"task-1","target":"send","steps":[{"status":503,"retry_after":"1"},{"delay_ms":0}]}`)
	is.Equal(status, http.StatusOK) // send script accepted
	status, _ = ctl.do(http.MethodPost, "/control/sms/script",
		`{"ref":"task-1","target":"query","steps":[{"status":503}]}`)
	is.Equal(status, http.StatusOK) // query script accepted
	status, _ = ctl.do(http.MethodPost, "/control/push/script",
		`{"ref":"","steps":[{"delay_ms":1500}]}`)
	is.Equal(status, http.StatusOK) // ref "" scripts the shared queue

	got, _ := send(t, sms, "task-1")
	is.Equal(got, http.StatusServiceUnavailable) // first scripted step
	got, _ = send(t, sms, "task-1")
	is.Equal(got, http.StatusOK) // second step accepts
	got, _ = query(t, sms, "task-1")
	is.Equal(got, http.StatusServiceUnavailable) // scripted query failure

	client := &http.Client{Timeout: 100 * time.Millisecond}
	_, err := postSend(client, push, "task-9", "ntf-task-9")
	is.True(err != nil) // the shared delay applied to an unscripted ref

	status, body := ctl.do(http.MethodGet, "/control/sms/counts", "")
	is.Equal(status, http.StatusOK) // counts served
	var counts fakes.Counts
	is.NoErr(json.Unmarshal(body, &counts)) // counts are JSON
	is.Equal(counts.Sends["task-1"], 2)     // two sends
	is.Equal(counts.Outbound["task-1"], 1)  // one message
	is.Equal(counts.Queries["task-1"], 1)   // one query

	status, body = ctl.do(http.MethodGet, "/control/counts", "")
	is.Equal(status, http.StatusOK) // all counts served
	var all map[string]fakes.Counts
	is.NoErr(json.Unmarshal(body, &all))                        // keyed by kind
	is.Equal(all["sms"].Outbound["task-1"], 1)                  // sms included
	is.Equal(all["push"].Outbound["task-9"], 1)                 // push included
	is.True(all["none"].Outbound != nil)                        // none included, empty but not null
	is.True(bytes.Contains(body, []byte(`"none":{"sends":{}`))) // empty maps marshal as {}
}

func TestControlErrors(t *testing.T) {
	is := is.New(t)
	srv := httptest.NewServer(fakes.ControlHandler(start(t, fakes.SMS)))
	defer srv.Close()
	ctl := control{t: t, url: srv.URL}
	cases := []struct {
		name, method, path, body string
		want                     int
	}{
		{"bad json", http.MethodPost, "/control/sms/script", `{"ref":`, http.StatusBadRequest},
		{"unknown field", http.MethodPost, "/control/sms/script", `{"ref":"task-1","steps":[{"delay":5}]}`, http.StatusBadRequest},
		{"unknown kind", http.MethodPost, "/control/fax/script", `{"steps":[{}]}`, http.StatusBadRequest},
		{"kind not served", http.MethodGet, "/control/push/counts", ``, http.StatusBadRequest},
		{"unknown target", http.MethodPost, "/control/sms/script", `{"target":"sideways","steps":[{}]}`, http.StatusBadRequest},
		{"no steps", http.MethodPost, "/control/sms/script", `{"ref":"task-1"}`, http.StatusBadRequest},
		{"bad status", http.MethodPost, "/control/sms/script", `{"steps":[{"status":42}]}`, http.StatusBadRequest},
		{"negative delay", http.MethodPost, "/control/sms/script", `{"steps":[{"delay_ms":-1}]}`, http.StatusBadRequest},
		{"wrong method", http.MethodGet, "/control/sms/script", ``, http.StatusMethodNotAllowed},
		{"unknown path", http.MethodGet, "/control/sms/nope", ``, http.StatusNotFound},
	}
	for _, tc := range cases {
		status, body := ctl.do(tc.method, tc.path, tc.body)
		var e struct {
			Error string `json:"error"`
		}
		is.NoErr(json.Unmarshal(body, &e)) // error body is JSON
		is.Equal(status, tc.want)          // status for this case
		is.True(e.Error != "")             // with a clear message
	}
}

// rawRequest writes one HTTP/1.1 request on conn, kept alive.
func rawRequest(t *testing.T, conn net.Conn, method, path, key, body string) {
	t.Helper()
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: fake\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", method, path, len(body))
	if key != "" {
		req += "Idempotency-Key: " + key + "\r\n"
	}
	if _, err := io.WriteString(conn, req+"\r\n"+body); err != nil {
		t.Fatalf("write request: %v", err)
	}
}

// TestDropAfterAcceptance: a Drop step records the acceptance exactly as an answered send would and
// then closes the kept-alive connection without a byte of answer.
func TestDropAfterAcceptance(t *testing.T) {
	for _, kind := range []fakes.Kind{fakes.Push, fakes.SMS, fakes.None} {
		t.Run(string(kind), func(t *testing.T) {
			is := is.New(t)
			c := start(t, kind)
			c.ScriptSend("task-2", fakes.Step{Drop: true})
			conn, err := net.Dial("tcp", strings.TrimPrefix(c.URL(), "http://"))
			is.NoErr(err) // connected
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(conn)

			rawRequest(t, conn, http.MethodPost, "/send", "ntf-task-1", `{"ref":"task-1","to":"a","body":"b"}`)
			resp, err := http.ReadResponse(br, nil)
			is.NoErr(err)                            // the first request is answered
			is.Equal(resp.StatusCode, http.StatusOK) // accepted
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()

			rawRequest(t, conn, http.MethodPost, "/send", "ntf-task-2", `{"ref":"task-2","to":"a","body":"b"}`)
			n, err := br.Read(make([]byte, 1))
			is.Equal(n, 0)                    // not a byte of answer
			is.Equal(err, io.EOF)             // the connection was closed, in order
			is.Equal(c.Conns(), 1)            // both requests came on one kept-alive connection
			is.Equal(c.Sends("task-2"), 1)    // the dropped request was counted
			is.Equal(c.Outbound("task-2"), 1) // and accepted: a message went out

			status, reply := send(t, c, "task-2")
			is.Equal(status, http.StatusOK)                                                                      // the next request is answered again
			is.Equal(reply.Replayed, kind == fakes.Push)                                                         // push kept the dropped request's key
			is.Equal(c.Outbound("task-2"), map[fakes.Kind]int{fakes.Push: 1, fakes.SMS: 2, fakes.None: 2}[kind]) // as for an answered send
		})
	}
}

// TestDropQuery: a query answered by a dropped connection is counted, and nothing else changes.
func TestDropQuery(t *testing.T) {
	is := is.New(t)
	c := start(t, fakes.SMS)
	send(t, c, "task-1")
	c.ScriptQuery("task-1", fakes.Step{Drop: true})
	conn, err := net.Dial("tcp", strings.TrimPrefix(c.URL(), "http://"))
	is.NoErr(err) // connected
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	rawRequest(t, conn, http.MethodGet, "/messages?ref=task-1", "", "")
	n, err := bufio.NewReader(conn).Read(make([]byte, 1))
	is.Equal(n, 0)                   // no answer
	is.Equal(err, io.EOF)            // the connection was closed
	is.Equal(c.Queries("task-1"), 1) // the query was counted
	_, found := query(t, c, "task-1")
	is.Equal(found.Found, 1) // and the next one is answered
}

// TestControlDropStep: drop travels through the control API, and contradictory steps are refused.
func TestControlDropStep(t *testing.T) {
	is := is.New(t)
	c := start(t, fakes.None)
	srv := httptest.NewServer(fakes.ControlHandler(c))
	defer srv.Close()
	ctl := control{t: t, url: srv.URL}
	status, _ := ctl.do(http.MethodPost, "/control/none/script", `{"ref":"task-1","steps":[{"drop":true}]}`)
	is.Equal(status, http.StatusOK) // a drop step is accepted
	_, err := postSend(&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, c, "task-1", "")
	is.True(err != nil)               // the connection closed without an answer
	is.Equal(c.Outbound("task-1"), 1) // after the message was accepted
	for _, bad := range []string{`{"drop":true,"status":503}`, `{"drop":true,"hang":true}`, `{"drop":true,"malformed":true}`, `{"drop":true,"slow_body_ms":5}`} {
		status, _ := ctl.do(http.MethodPost, "/control/none/script", `{"steps":[`+bad+`]}`)
		is.Equal(status, http.StatusBadRequest) // a drop answers nothing, so it cannot also answer
	}
}

// SetRateLimit makes the fake enforce a provider's limit: a burst of one second's worth, then sends
// that find no token are answered 429 with Retry-After before anything else (no acceptance, no scripted
// step used), counted per ref; once a token has come back, sends are accepted again. Acceptance times
// are recorded for rate measurements.
func TestRateLimit(t *testing.T) {
	is := is.New(t)
	c := start(t, fakes.Push)
	var clock sync.Mutex
	now := time.Now()
	c.SetClock(func() time.Time { clock.Lock(); defer clock.Unlock(); return now })
	advance := func(d time.Duration) { clock.Lock(); defer clock.Unlock(); now = now.Add(d) }
	c.SetRateLimit(1) // 1/s, burst 1: the next token comes a second after the first send
	c.ScriptSend("task-2", fakes.Step{Status: 503})
	status, _ := send(t, c, "task-1")
	is.Equal(status, http.StatusOK) // the burst
	resp, err := postSend(http.DefaultClient, c, "task-2", "ntf-task-2")
	is.NoErr(err)
	resp.Body.Close()
	is.Equal(resp.StatusCode, http.StatusTooManyRequests) // over the rate
	is.Equal(resp.Header.Get("Retry-After"), "1")         // whole seconds until the next token
	is.Equal(c.Throttled("task-2"), 1)                    // counted
	is.Equal(c.TotalThrottled(), 1)
	is.Equal(c.Sends("task-2"), 1)    // as a send
	is.Equal(c.Outbound("task-2"), 0) // never accepted
	is.Equal(c.Snapshot().Throttled, map[string]int{"task-2": 1})
	is.Equal(len(c.AcceptedAt()), 1) // one acceptance recorded

	advance(600 * time.Millisecond) // not yet a token
	resp, err = postSend(http.DefaultClient, c, "task-2", "ntf-task-2")
	is.NoErr(err)
	resp.Body.Close()
	is.Equal(resp.StatusCode, http.StatusTooManyRequests) // still over the rate
	is.Equal(resp.Header.Get("Retry-After"), "1")         // 0.4 s, rounded up to a whole second
	is.Equal(c.Throttled("task-2"), 2)

	advance(400 * time.Millisecond) // a second since the first send: a token is back
	status, _ = send(t, c, "task-2")
	is.Equal(status, http.StatusServiceUnavailable) // the scripted step was kept for the send the limit let through

	c.SetRateLimit(0) // no limit
	for i := range 5 {
		status, _ := send(t, c, fmt.Sprintf("task-%d", 10+i))
		is.Equal(status, http.StatusOK) // accepted at once
	}
	times := c.AcceptedAt()
	is.Equal(len(times), 6)
	for i := 1; i < len(times); i++ {
		is.True(!times[i].Before(times[i-1])) // in order
	}
}
