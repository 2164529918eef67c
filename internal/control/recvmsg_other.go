//go:build !linux

package control

// recvmsg reads one datagram into c.rbuf and c.oob (the raw path is Linux only).
func (c *Conn) recvmsg() (n, oobn, flags int, err error) {
	n, oobn, flags, _, err = c.uc.ReadMsgUnix(c.rbuf, c.oob)
	return n, oobn, flags, err
}
