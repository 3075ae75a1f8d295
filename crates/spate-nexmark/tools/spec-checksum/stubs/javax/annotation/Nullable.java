package javax.annotation;
public @interface Nullable {}
