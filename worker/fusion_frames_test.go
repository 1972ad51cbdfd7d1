package worker_test

// fusionFrames is a program whose elementwise runs fuse (and one whose
// run fails on a shape), read at every step, for comparing a device that
// fuses with one that does not: a frame with a run ending in a reduction
// and freed intermediates, reads of the kept results, a read of a freed
// intermediate, and a shape error inside a run.
var fusionFrames = []string{
	`{"v":1,"ops":[
		{"op":"upload","out":[1],"dtype":"f32","shape":[4,3],"values":[1,-2,3,0.5,5,-6,7,8,0.25,-10,11,12]},
		{"op":"upload","out":[2],"dtype":"f32","shape":[3],"values":[0.5,-1.5,2]},
		{"op":"mul","out":[3],"in":[1,2]},
		{"op":"add","out":[4],"in":[3,1]},
		{"op":"tanh","out":[5],"in":[4]},
		{"op":"sub","out":[6],"in":[5,2]},
		{"op":"sum","out":[7],"in":[6],"axes":[1]},
		{"op":"free","in":[3,4]},
		{"op":"read","in":[6],"tag":1}]}`,
	`{"v":1,"ops":[{"op":"read","in":[7],"tag":2}]}`,
	`{"v":1,"ops":[{"op":"read","in":[5],"tag":3}]}`,
	`{"v":1,"ops":[{"op":"read","in":[3],"tag":4}]}`,
	// A shape error inside a run: the same error from both.
	`{"v":1,"ops":[
		{"op":"upload","out":[10],"dtype":"f32","shape":[2],"values":[1,2]},
		{"op":"exp","out":[11],"in":[10]},
		{"op":"add","out":[12],"in":[11,1]},
		{"op":"neg","out":[13],"in":[12]},
		{"op":"read","in":[13],"tag":5}]}`,
}
