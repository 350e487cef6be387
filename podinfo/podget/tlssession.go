package podget

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nftmesh/nftmesh/internal/atomicfile"
)

// TLS session resumption across plugin runs.
//
// Every ADD is a new process, so every pod GET starts with a full TLS
// handshake with the API server: ~2.5 ms here, most of it the server's
// certificate signature and key exchange, the largest single part of an
// ADD after process start. A TLS 1.3 session ticket kept in a file lets the
// next run resume instead (~1 ms). The file sits beside the kubeconfig in
// the agent's run dir, mode 0600: it is a secret of the same order as the
// token next to it. Resumption still does a fresh (EC)DHE exchange, so a
// leaked ticket does not expose recorded traffic.
//
// A session is only offered to the server it came from under the trust it
// was verified with: the file name hashes the server address, the server
// name and the CA bundle, and crypto/tls re-checks the stored certificate's
// name and expiry before resuming. Anything unreadable is ignored, which
// costs a full handshake and nothing else.

// SessionFilePrefix starts the names of the session files in the agent's
// run dir (the agent removes them with the kubeconfig).
const SessionFilePrefix = "tls-session-"

// sessionMagic heads a session file; a file with another header is ignored.
const sessionMagic = "nftmesh-tls-session/1\n"

// sessionRefresh: a resumed handshake rewrites the file only when it is
// older than this (every handshake brings a new ticket; writing each one
// would cost every ADD a file write for nothing). The API server's Go TLS
// stack accepts tickets for 7 days and rotates its ticket key daily.
const sessionRefresh = time.Hour

// sessionFileName is the session file in dir for a TLS config (its
// server name and CA bundle) and the API server address.
func sessionFileName(dir, host, serverName string, caData []byte) string {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(host), []byte(serverName), caData} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	return filepath.Join(dir, SessionFilePrefix+hex.EncodeToString(h.Sum(nil)[:12]))
}

// fileSessionCache is a tls.ClientSessionCache of one entry, kept in a
// file. It also watches, through the TLS config's VerifyConnection, whether
// the handshake resumed.
type fileSessionCache struct {
	path string

	mu       sync.Mutex
	resumed  bool // the last handshake resumed
	fresh    bool // the file was younger than sessionRefresh when read
	writeErr error
}

var _ tls.ClientSessionCache = (*fileSessionCache)(nil)

// install makes tc use the cache and report resumptions to it.
func (c *fileSessionCache) install(tc *tls.Config) {
	tc.ClientSessionCache = c
	next := tc.VerifyConnection
	tc.VerifyConnection = func(cs tls.ConnectionState) error {
		c.mu.Lock()
		c.resumed = cs.DidResume
		c.mu.Unlock()
		if next != nil {
			return next(cs)
		}
		return nil
	}
}

// Get implements tls.ClientSessionCache.
func (c *fileSessionCache) Get(key string) (*tls.ClientSessionState, bool) {
	f, err := os.Open(c.path)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Size() > maxSessionFile {
		return nil, false
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil {
		return nil, false
	}
	k, ticket, state, err := decodeSession(b)
	if err != nil || k != key {
		return nil, false
	}
	ss, err := tls.ParseSessionState(state)
	if err != nil {
		return nil, false
	}
	cs, err := tls.NewResumptionState(ticket, ss)
	if err != nil {
		return nil, false
	}
	c.mu.Lock()
	c.fresh = time.Since(st.ModTime()) < sessionRefresh
	c.mu.Unlock()
	return cs, true
}

// Put implements tls.ClientSessionCache: it keeps a new ticket unless the
// handshake resumed from a recent file. Errors are remembered, not
// returned: a cache that cannot be written only costs full handshakes.
func (c *fileSessionCache) Put(key string, cs *tls.ClientSessionState) {
	if cs == nil {
		_ = os.Remove(c.path)
		return
	}
	c.mu.Lock()
	skip := c.resumed && c.fresh
	c.mu.Unlock()
	if skip {
		return
	}
	err := c.write(key, cs)
	c.mu.Lock()
	c.writeErr = err
	if err == nil {
		c.fresh = true
	}
	c.mu.Unlock()
}

func (c *fileSessionCache) write(key string, cs *tls.ClientSessionState) error {
	ticket, ss, err := cs.ResumptionState()
	if err != nil {
		return err
	}
	if ss == nil {
		return errors.New("no session state")
	}
	state, err := ss.Bytes()
	if err != nil {
		return err
	}
	return atomicfile.Write(c.path, encodeSession(key, ticket, state), 0o600, atomicfile.Options{})
}

// WriteErr is the last error writing the session file, if any.
func (c *fileSessionCache) WriteErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writeErr
}

// maxSessionFile bounds what Get reads: a ticket and a state with the
// server's certificate chain are a few KiB.
const maxSessionFile = 1 << 20

// encodeSession lays out a session file: magic, then key, ticket and state,
// each preceded by its length as a uvarint.
func encodeSession(key string, ticket, state []byte) []byte {
	b := make([]byte, 0, len(sessionMagic)+len(key)+len(ticket)+len(state)+3*binary.MaxVarintLen64)
	b = append(b, sessionMagic...)
	for _, part := range [][]byte{[]byte(key), ticket, state} {
		b = binary.AppendUvarint(b, uint64(len(part)))
		b = append(b, part...)
	}
	return b
}

// decodeSession reads what encodeSession wrote; anything else is an error.
func decodeSession(b []byte) (key string, ticket, state []byte, err error) {
	rest, ok := bytes.CutPrefix(b, []byte(sessionMagic))
	if !ok {
		return "", nil, nil, errors.New("not a session file")
	}
	var parts [3][]byte
	for i := range parts {
		n, w := binary.Uvarint(rest)
		if w <= 0 || n > uint64(len(rest)-w) {
			return "", nil, nil, fmt.Errorf("session file: part %d truncated", i)
		}
		// Uvarint also reads padded encodings (0x80 0x00 is 0). Only the
		// shortest one is what encodeSession writes, so only it is a
		// session file: one meaning, one encoding.
		if w != uvarintLen(n) {
			return "", nil, nil, fmt.Errorf("session file: part %d length is not minimally encoded", i)
		}
		parts[i] = rest[w : w+int(n)]
		rest = rest[w+int(n):]
	}
	if len(rest) != 0 {
		return "", nil, nil, errors.New("session file: trailing bytes")
	}
	if len(parts[1]) == 0 || len(parts[2]) == 0 {
		return "", nil, nil, errors.New("session file: empty ticket or state")
	}
	return string(parts[0]), parts[1], parts[2], nil
}

// uvarintLen is the length of the shortest uvarint encoding of n.
func uvarintLen(n uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], n)
}

// RemoveTLSSessions deletes the session files in dir (the agent's run dir):
// when the agent removes or rewrites the kubeconfig, and on its way out.
func RemoveTLSSessions(dir string) error {
	matches, err := filepath.Glob(filepath.Join(dir, SessionFilePrefix+"*"))
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range matches {
		if err := os.Remove(m); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
