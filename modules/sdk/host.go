//go:build !wasip1

package sdk

func hostLogString(int, string) {}
