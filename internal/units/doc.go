// Package units renders byte counts for people (strapd status, strapd top, strapd trace
// --no-output): one rendering, so every view of the same number reads the same.
package units
