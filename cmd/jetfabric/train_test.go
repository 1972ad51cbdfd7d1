package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
)

func TestTrainFlagsRefused(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-model", "rnn"}, `-model "rnn": want mlp or cnn`},
		{[]string{"-device", "cpu.0"}, `device "cpu.0"`},
		{[]string{"-devices", "cpu-0,cpu-0"}, "names cpu-0 twice"},
		{[]string{"-devices", "cpu-0,"}, `device ""`},
		{[]string{"-epochs", "0"}, "-epochs 0"},
		{[]string{"-batch", "0"}, "-batch 0"},
		{[]string{"-batch", "1", "-devices", "cpu-0,cpu-1"}, "at least one example a device"},
		{[]string{"-lr", "0"}, "-lr 0"},
		{[]string{"-lr", "NaN"}, "-lr NaN"},
		{[]string{"-limit", "-1"}, "-limit -1"},
		{[]string{"-test-limit", "-5"}, "-test-limit -5"},
		{[]string{"-hidden", "0"}, "-hidden 0"},
		{[]string{"-model", "cnn", "-hidden", "64"}, "-hidden applies to the mlp"},
		{[]string{"-check-every", "0"}, "-check-every 0"},
		{[]string{"-progress", "-1s"}, "-progress -1s"},
		{[]string{"-save", "w.bin"}, `-save "w.bin"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("train", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var f trainFlags
			f.register(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			err := f.validate()
			if !errors.Is(err, errFlag) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want errFlag with %q", err, tt.want)
			}
		})
	}
	var f trainFlags
	f.register(flag.NewFlagSet("train", flag.ContinueOnError))
	if err := f.validate(); err != nil || len(f.devices) != 1 || f.devices[0] != "cpu-0" {
		t.Fatalf("defaults: %v %v", err, f.devices)
	}
}
