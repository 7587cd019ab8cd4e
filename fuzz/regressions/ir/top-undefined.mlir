%a = sage.dequant %b
