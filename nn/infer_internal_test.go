package nn

import (
	"reflect"
	"testing"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
)

// TestFromWireInvertsWire: every attribute of an op survives its trip to
// the wire and back, so that a split graph types the tensors it hands on
// as the ops that made them did. A field added to kernels.Op and not to
// both directions fails here.
func TestFromWireInvertsWire(t *testing.T) {
	var k kernels.Op
	v := reflect.ValueOf(&k).Elem()
	for i := range v.NumField() {
		f, name := v.Field(i), v.Type().Field(i).Name
		switch {
		case name == "Seed" || name == "Key": // keyed by the worker, never sent
		case name == "Name":
			f.SetString(kernels.OpAdd)
		case name == "DType":
			f.Set(reflect.ValueOf(kernels.Float16))
		case f.Kind() == reflect.String:
			f.SetString("sum")
		case f.Kind() == reflect.Int:
			f.SetInt(int64(i + 1))
		case f.Kind() == reflect.Float64:
			f.SetFloat(float64(i) + 0.5)
		case f.Kind() == reflect.Bool:
			f.SetBool(true)
		case f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.Int:
			f.Set(reflect.ValueOf([]int{i, i + 1}))
		default:
			t.Fatalf("kernels.Op.%s is a %v: teach this test (and codec.KernelOp) about it", name, f.Type())
		}
	}
	d := opDesc{k: k}
	w := d.wire()
	got, err := codec.KernelOp(&w)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, k) {
		t.Fatalf("through the wire and back:\n%+v\nwant\n%+v", got, k)
	}
	w.DType = "f33"
	if _, err := codec.KernelOp(&w); err == nil {
		t.Fatal("codec.KernelOp accepted dtype f33")
	}
}
