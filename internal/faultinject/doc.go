// Package faultinject makes a child process's writes fail with EIO, for tests: a seccomp
// filter hands every write-family system call of the child to this process, which answers
// EIO for the files a Rule names and lets the others run. Nothing in strapd uses it.
package faultinject
