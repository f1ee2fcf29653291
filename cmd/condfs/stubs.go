package main

import "io"

func runServe(args []string, stdout, stderr io.Writer) error { return nil }
func runCtl(args []string, stdout, stderr io.Writer) error   { return nil }
