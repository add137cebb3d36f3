package httpkit_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// HTTP/2 frame types and flags this proxy looks at (RFC 9113 section 6).
const (
	frameHeaders   = 0x1
	frameRSTStream = 0x3
	framePing      = 0x6
	frameGoAway    = 0x7
	flagEndStream  = 0x1
	flagAck        = 0x1
	codeProtocol   = 0x1
	codeRefused    = 0x7 // REFUSED_STREAM
)

// h2Proxy relays cleartext HTTP/2 (h2c, prior knowledge) between a client and a server, frame by
// frame, and injects frames towards the client that the server never sent: a stream reset once the
// server has the request, or a GOAWAY. The client cannot tell them from the server's.
type h2Proxy struct {
	ln      net.Listener
	backend string

	mu    sync.Mutex
	conns []*h2ProxyConn

	// resetNth: on the first connection, reset the stream of the nth request (1-based) with
	// PROTOCOL_ERROR once its last frame went to the server and counted is closed; then injected is
	// closed. 0: no reset.
	resetNth  int
	resetCode uint32 // the reset's error code; 0: PROTOCOL_ERROR
	counted   chan struct{}
	injected  chan struct{}
	pingAck   chan struct{} // a client acknowledged the proxy's own PING
}

// pingData marks the proxy's own PING, whose ACK is not the server's business.
var pingData = []byte("notifier")

type h2ProxyConn struct {
	client net.Conn
	wmu    sync.Mutex    // frames towards the client are written whole
	gone   chan struct{} // closed when the client's side of the connection ends
}

func startH2Proxy(t *testing.T, backend string) *h2Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &h2Proxy{ln: ln, backend: backend, counted: make(chan struct{}), injected: make(chan struct{}), pingAck: make(chan struct{}, 1)}
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			_ = c.client.Close()
		}
	})
	return p
}

func (p *h2Proxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *h2Proxy) connCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func (p *h2Proxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.backend)
		if err != nil {
			_ = client.Close()
			continue
		}
		pc := &h2ProxyConn{client: client, gone: make(chan struct{})}
		p.mu.Lock()
		index := len(p.conns)
		p.conns = append(p.conns, pc)
		p.mu.Unlock()
		go func() { // server -> client, as is
			defer client.Close()
			for {
				hdr, payload, err := readFrame(server)
				if err != nil {
					return
				}
				if pc.write(append(hdr, payload...)) != nil {
					return
				}
			}
		}()
		go p.clientToServer(index, pc, server)
	}
}

func (p *h2Proxy) clientToServer(index int, pc *h2ProxyConn, server net.Conn) {
	defer server.Close()
	defer close(pc.gone)
	preface := make([]byte, 24)
	if _, err := io.ReadFull(pc.client, preface); err != nil {
		return
	}
	if _, err := server.Write(preface); err != nil {
		return
	}
	requests, target := 0, uint32(0)
	for {
		hdr, payload, err := readFrame(pc.client)
		if err != nil {
			return
		}
		typ, flags, stream := hdr[3], hdr[4], binary.BigEndian.Uint32(hdr[5:9])&0x7fffffff
		if typ == framePing && flags&flagAck != 0 && string(payload) == string(pingData) {
			p.pingAck <- struct{}{}
			continue
		}
		if _, err := server.Write(append(hdr, payload...)); err != nil {
			return
		}
		if index != 0 || p.resetNth == 0 {
			continue
		}
		if typ == frameHeaders {
			requests++
			if requests == p.resetNth {
				target = stream
			}
		}
		if target != 0 && stream == target && flags&flagEndStream != 0 {
			<-p.counted // the server has the whole request and counted it
			code := p.resetCode
			if code == 0 {
				code = codeProtocol
			}
			_ = pc.write(frame(frameRSTStream, 0, target, binary.BigEndian.AppendUint32(nil, code)))
			close(p.injected)
			target = 0
		}
	}
}

// goAwayAndWait sends the client of connection index a GOAWAY (NO_ERROR) naming lastStream as the
// last stream the server will process, then a PING, and waits for its ACK: a client handles frames in
// order, so by then it has taken the GOAWAY in. A client may instead close the connection once the
// GOAWAY left it with no stream, before it reads the PING; that too means it took the GOAWAY in.
func (p *h2Proxy) goAwayAndWait(index int, lastStream uint32) error {
	p.mu.Lock()
	pc := p.conns[index]
	p.mu.Unlock()
	payload := binary.BigEndian.AppendUint32(nil, lastStream)
	payload = binary.BigEndian.AppendUint32(payload, 0)
	if err := pc.write(append(frame(frameGoAway, 0, 0, payload), frame(framePing, 0, 0, pingData)...)); err != nil {
		return err
	}
	select {
	case <-p.pingAck:
		return nil
	case <-pc.gone:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("h2 proxy: the client neither acknowledged the PING nor closed the connection within 10s")
	}
}

func (pc *h2ProxyConn) write(b []byte) error {
	pc.wmu.Lock()
	defer pc.wmu.Unlock()
	_, err := pc.client.Write(b)
	return err
}

// readFrame reads one frame: its 9-byte header (length 3, type 1, flags 1, stream 4) and payload.
func readFrame(r io.Reader) (hdr, payload []byte, err error) {
	hdr = make([]byte, 9)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, nil, err
	}
	n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return nil, nil, err
	}
	return hdr, payload, nil
}

func frame(typ, flags byte, stream uint32, payload []byte) []byte {
	n := len(payload)
	b := []byte{byte(n >> 16), byte(n >> 8), byte(n), typ, flags}
	b = binary.BigEndian.AppendUint32(b, stream)
	return append(b, payload...)
}
